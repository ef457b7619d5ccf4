"""Pins on the upstream functions grail patches, overrides or reads the private state of: each
named ``module:qualified name`` with the first hex digits of the sha256 of its source at the
pinned version and why grail depends on it. A table of them lives beside the code that patches
(:data:`grail.train.overrides.UPSTREAM`: TRL, transformers, accelerate;
:data:`grail.launch.kfp_local.UPSTREAM`: kfp.local); tests/test_overrides.py recomputes every
digest, so an upgrade that changes one fails by name before it fails in a run."""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable


def upstream_function(name: str):
    """The function ``module:qualified name`` names, as installed (a class attribute read
    from the class itself, a property as its getter)."""
    module, _, qualified = name.partition(":")
    found = importlib.import_module(module)
    for part in qualified.split("."):
        owner = found
        found = (
            vars(owner)[part]
            if isinstance(owner, type) and part in vars(owner)
            else (getattr(owner, part))
        )
    return found.fget if isinstance(found, property) else found


def changed_since_pinned(
    table: dict[str, tuple[str, str]], source: Callable[[str], str]
) -> list[str]:
    """Each function of `table` whose source (`source(name)`) no longer has its pinned digest,
    as ``NAME: changed since it was pinned; grail WHY``: the functions to re-read before the
    pin moves."""
    changed = []
    for name, (digest, reason) in table.items():
        if hashlib.sha256(source(name).encode()).hexdigest()[: len(digest)] != digest:
            changed.append(f"{name}: changed since it was pinned; grail {reason}")
    return changed


def source_of(name: str) -> str:
    """The installed source of the function `name` names."""
    return inspect.getsource(upstream_function(name))
