"""This machine's pip package sources, for image builds and resolution checks.

A site behind a mirror or a TLS-intercepting proxy configures pip (index, extra indexes,
find-links, CA bundle); the image builds and ``make check-images`` must use the same sources
without copying any of them into an image. Standard library only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

KEYS = ("index-url", "extra-index-url", "find-links", "trusted-host", "timeout", "retries")


def settings(find_links: bool = True) -> dict[str, str]:
    """pip's index settings from its configuration files and PIP_* variables, without the ones
    naming files a build cannot see (``constraint``; the CA bundle is :func:`ca_bundle`), and
    without find-links unless `find_links` (a local CPU torch wheel there would win over
    PyPI's CUDA build: ``2.13.0+cpu`` sorts above ``2.13.0``)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    found = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        name = key.split(".", 1)[-1]
        if name in KEYS:
            found[name] = value.strip().strip("'\"")
    for name in KEYS:
        value = os.environ.get("PIP_" + name.upper().replace("-", "_"))
        if value:
            found[name] = value
    if not find_links:
        found.pop("find-links", None)
    return found


def local_folders(found: dict[str, str]) -> list[str]:
    """Folders the settings name (file:// indexes, find-links), to mount read-only in a build.
    An index's folder is mounted above ``simple/``: its pages link to ``../../files``."""
    folders = []
    for value in found.values():
        for item in value.split():
            path = item.removeprefix("file://").rstrip("/")
            if path.startswith("/") and Path(path).exists():
                folders.append(path.removesuffix("/simple"))
    return sorted(set(folders))


def ca_bundle() -> str | None:
    for candidate in (os.environ.get("PIP_CERT"), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def environment(find_links: bool = True) -> dict[str, str]:
    """Variables that make pip use exactly these sources (and no configuration file, so that
    find-links, which may hold the CPU torch wheel, can be left out for a CUDA resolution)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    for name, value in settings(find_links).items():
        env["PIP_" + name.upper().replace("-", "_")] = value
    if ca_bundle():
        env["PIP_CERT"] = ca_bundle()
    return env
