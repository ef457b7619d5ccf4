"""grail.train.overrides holds every use of a library's private name: each upstream function it
stands on is pinned by the digest of its source (an upgrade that changes one fails here, naming
it), and no other module of grail reaches a library's private name."""

from __future__ import annotations

import ast
from pathlib import Path

from grail.train.overrides import UPSTREAM, upstream_changes, upstream_source

SRC = Path(__file__).resolve().parents[1] / "src" / "grail"
OVERRIDES = SRC / "train" / "overrides.py"
# private-looking names the standard library documents as its API
DOCUMENTED = {"_exit", "_asdict", "_replace", "_fields", "_make", "_getframe"}


def test_every_upstream_function_grail_stands_on_is_as_pinned():
    """A failure names the function that changed: re-read it against the override, then
    update its digest in UPSTREAM."""
    assert upstream_changes() == []


def test_a_changed_upstream_function_fails_the_guard_by_name():
    """TRL's _compute_loss with one more line, as a release would change it."""
    changed = "trl.trainer.grpo_trainer:GRPOTrainer._compute_loss"

    def edited(name):
        return upstream_source(name) + ("        return loss\n" if name == changed else "")

    (line,) = upstream_changes(edited)
    assert line.startswith(f"{changed}: changed since it was pinned; grail overridden:")


def test_every_override_of_grails_trainers_is_pinned():
    """Each private method grail's trainers override is in UPSTREAM (no override slips in
    unpinned)."""
    from grail.train.overrides import ExtraSignatureColumns, GrailGRPOTrainer

    overridden = {
        f"{base.__module__}:{base.__qualname__}.{name}"
        for cls in (GrailGRPOTrainer, ExtraSignatureColumns)
        for name in vars(cls)
        if name.startswith("_") and not name.startswith("__")
        for base in cls.__mro__[1:]
        if name in vars(base)
    }
    assert overridden, "no override found: the check itself is broken"
    pinned = {name.split(":")[1].split(".")[-1] for name in UPSTREAM}
    assert {name.rsplit(".", 1)[1] for name in overridden} <= pinned


def own_private_names() -> set[str]:
    """The private names grail defines itself (functions, methods, attributes it assigns),
    outside overrides.py."""
    names = set()
    for path in SRC.rglob("*.py"):
        if path == OVERRIDES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if n.startswith("_")}


def private_uses(paths, ours: set[str]) -> list[str]:
    """``path:line .name`` for each attribute named privately that is not grail's own."""
    found = []
    for path in sorted(paths):
        for node in ast.walk(ast.parse(Path(path).read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and node.attr not in ours
            ):
                found.append(f"{Path(path).name}:{node.lineno} .{node.attr}")
    return found


def test_no_other_module_reaches_a_librarys_private_name(tmp_path):
    ours = own_private_names() | DOCUMENTED
    paths = [p for p in SRC.rglob("*.py") if p != OVERRIDES]
    assert private_uses(paths, ours) == [], "move these into grail/train/overrides.py"
    # the check sees one: a module reading transformers' private attention setting
    (tmp_path / "reads.py").write_text("def f(config):\n    return config._attn_implementation\n")
    assert private_uses([tmp_path / "reads.py"], ours) == ["reads.py:2 ._attn_implementation"]
