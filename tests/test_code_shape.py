"""The shape the code keeps: dependencies point one way, lint covers every Python folder, and no
function grows past a screenful or so."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "grail"
LONGEST = 80  # lines per function, the DAG's signature aside


def _python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_the_package_imports_nothing_outside_it_and_leaves_sys_path_alone():
    import importlib.metadata

    outside = {"pipelines", "components", "tests", "bench", "docker"}
    # `docker` is also the Docker SDK (grail.engine talks to a Docker API with it): a declared
    # dependency, not the repository's docker/ folder
    sdk = {"docker"} & set(importlib.metadata.packages_distributions().get("docker", []))
    assert sdk == {"docker"}
    for path in _python_files(PACKAGE):
        tree = ast.parse(path.read_text())
        allowed = sdk if path.name == "engine.py" else set()
        wrong = {
            name
            for name in _imports(tree)
            if name.split(".")[0] in outside and name.split(".")[0] not in allowed
        }
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"
        assert "sys.path" not in ast.unparse(tree), f"{path.relative_to(ROOT)} edits sys.path"


def test_the_components_and_the_pipeline_sit_above_the_stages():
    """Stages never import the KFP layer (grail.pipeline, grail.components); only launch does."""
    for path in _python_files(PACKAGE):
        if path.parent.name == "components" or path.name in ("pipeline.py", "launch.py"):
            continue
        kfp_layer = {
            name
            for name in _imports(ast.parse(path.read_text()))
            if name in ("grail.pipeline",) or name.startswith("grail.components")
        }
        assert not kfp_layer, f"{path.relative_to(ROOT)} imports {sorted(kfp_layer)}"


def test_make_lint_covers_every_python_folder_and_make_test_runs_it():
    makefile = (ROOT / "Makefile").read_text()
    linted = set(re.search(r"^PYTHON_DIRS := (.+)$", makefile, re.M).group(1).split())
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    folders = {Path(name).parts[0] for name in tracked if len(Path(name).parts) > 1}
    assert folders <= linted, f"not linted: {sorted(folders - linted)}"
    assert re.search(r"^test: .*\blint\b", makefile, re.M)


def test_no_function_is_longer_than_80_lines():
    too_long = []
    for path in _python_files(PACKAGE):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            start = node.lineno
            if path.name == "pipeline.py" and node.name == "grail_pipeline":
                start = node.body[1].lineno  # its signature and Args: docstring do not count
            if node.end_lineno - start + 1 > LONGEST:
                lines = node.end_lineno - start + 1
                too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {lines}")
    assert not too_long, "\n".join(too_long)
