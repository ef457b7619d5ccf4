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


LIBRARIES = {"kfp", "transformers", "trl", "accelerate", "torch", "peft", "mlflow", "datasets",
             "distilabel", "vllm", "deepspeed", "boto3", "botocore"}  # fmt: skip
KFP_LOCAL = SRC / "launch" / "kfp_local.py"


def module_patches(paths) -> list[str]:
    """``path:line NAME.attr`` for each assignment to an attribute of a library's module (or
    of a name imported from one: a class, a module) that a grail module imported."""
    found = []
    for path in sorted(paths):
        tree = ast.parse(Path(path).read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {
                    (a.asname or a.name).split(".")[0]
                    for a in node.names
                    if a.name.split(".")[0] in LIBRARIES
                }
            elif (
                isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIBRARIES
            ):
                imported |= {a.asname or a.name for a in node.names}
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                base = target
                while isinstance(base, ast.Attribute):
                    base = base.value
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(base, ast.Name)
                    and base.id in imported
                ):
                    found.append(f"{Path(path).name}:{node.lineno} {base.id}.{target.attr}")
    return found


def test_every_patch_of_a_librarys_module_lives_beside_its_pins(tmp_path):
    """A library's function replaced in its module (kfp.local's, while a local run lasts)
    lives in the module that pins it: grail/launch/kfp_local.py or grail/train/overrides.py."""
    paths = [p for p in SRC.rglob("*.py") if p not in (OVERRIDES, KFP_LOCAL)]
    assert module_patches(paths) == [], "move these beside their pins"
    assert module_patches([KFP_LOCAL]), "the check itself finds none in kfp_local.py"
    (tmp_path / "patch.py").write_text(
        "from kfp.local import task_dispatcher\n\ntask_dispatcher.run_single_task = print\n"
    )
    assert module_patches([tmp_path / "patch.py"]) == ["patch.py:3 task_dispatcher.run_single_task"]


def test_every_kfp_function_grails_local_run_stands_on_is_as_pinned():
    from grail.core.pins import source_of
    from grail.launch.kfp_local import upstream_changes as kfp_changes

    assert kfp_changes() == []
    changed = "kfp.local.executor_input_utils:get_local_pipeline_resource_name"

    def edited(name):
        return source_of(name) + ("    return 'x'\n" if name == changed else "")

    (line,) = kfp_changes(edited)
    assert line.startswith(f"{changed}: changed since it was pinned; grail replaces it")
