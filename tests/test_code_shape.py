"""The shape the code keeps: dependencies point one way, lint covers every Python folder, and no
function grows past a screenful or so."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "grail"
LONGEST = 80  # lines per function, the signatures of the DAG and the components aside
# The folders installed as parts of the package (pyproject's package-dir): grail.components,
# grail.pipelines.
MAPPED = {"components": ROOT / "components", "pipelines": ROOT / "pipelines"}
STAGES = ("study", "clean", "generate", "train", "benchmark", "export")
# What each layer may import of grail: core <- inference <- tasks <- stages <- components <-
# pipelines <- launch, CLI. The code that asks a model (grail.inference: local transformers,
# vLLM, an OpenAI-compatible API) knows no task: it builds on core alone. What is particular to
# a task (grail.tasks: the slate task's study, cleaning rules, prompt, rewards, baselines,
# metrics and benchmark; the summarize task's) builds on core and inference; each stage runs
# every task and imports no other stage (the tiny model trains on a study the slate task
# simulates, not on the study stage).
MAY_IMPORT = {
    "core": {"core"},
    "inference": {"core", "inference"},
    "tasks": {"core", "inference", "tasks"},
    **{stage: {"core", "inference", "tasks", stage} for stage in STAGES},
    "components": {"core", "inference", "tasks", *STAGES, "components"},
    "pipelines": {"core", "tasks", "components", "pipelines", "clean.config", "generate.config"},
    "launch": {"core", "inference", "tasks", *STAGES, "components", "pipelines", "launch"},
    "cli": {"core", "inference", "tasks", *STAGES, "components", "pipelines", "launch", "commands"},
}


def _python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _package_files() -> list[tuple[str, Path]]:
    """(layer, file) for every module of the package, the mapped folders' tests aside."""
    found = []
    for path in _python_files(PACKAGE):
        parts = path.relative_to(PACKAGE).parts
        found.append((parts[0].removesuffix(".py") if len(parts) > 1 else "cli", path))
    for layer, folder in MAPPED.items():
        found += [(layer, p) for p in _python_files(folder) if "tests" not in p.parts]
    return found


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

    outside = {"pipelines", "components", "tests", "bench", "docker", "recipes"}
    # `docker` is also the Docker SDK (grail.launch.engine talks to a Docker API with it): a
    # declared dependency, not the repository's docker/ folder
    sdk = {"docker"} & set(importlib.metadata.packages_distributions().get("docker", []))
    assert sdk == {"docker"}
    for _, path in _package_files():
        tree = ast.parse(path.read_text())
        allowed = sdk if path.name == "engine.py" else set()
        wrong = {
            name
            for name in _imports(tree)
            if name.split(".")[0] in outside and name.split(".")[0] not in allowed
        }
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"
        assert "sys.path" not in ast.unparse(tree), f"{path.relative_to(ROOT)} edits sys.path"


def test_dependencies_point_one_way():
    """core <- inference <- tasks <- stages (study, clean, generate, train, benchmark, export) <-
    components <- pipelines <- launch and the CLI; the pipeline takes only the stages' config
    dataclasses."""
    wrong = []
    for layer, path in _package_files():
        allowed = MAY_IMPORT[layer]
        for name in _imports(ast.parse(path.read_text())):
            if name.split(".")[0] != "grail" or name == "grail":
                continue
            target = name.split(".")[1]
            if target not in allowed and ".".join(name.split(".")[1:3]) not in allowed:
                wrong.append(f"{path.relative_to(ROOT)} ({layer}) imports {name}")
    assert not wrong, "\n".join(wrong)


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_light_commands_and_the_pipeline_import_only_what_they_need():
    """`grail export` (boto3) loads no kfp or torch; the DAG's module loads no stage, only the
    config dataclasses its defaults come from."""
    export = _loaded_after("import grail.cli, grail.export.stage, grail.core.config")
    assert not {"kfp", "torch", "transformers", "mlflow"} & export
    dag = {m for m in _loaded_after("import grail.pipelines.dag") if m.startswith("grail.")}
    stages = {m for m in dag if m.split(".")[1] in STAGES and m.count(".") > 1}
    assert stages == {"grail.clean.config", "grail.generate.config"}, sorted(stages)


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
    for _, path in _package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            start = node.lineno
            dag = any(  # a @dsl.pipeline: its parameters are the Kubeflow UI's
                isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "pipeline"
                for d in node.decorator_list
            )
            if dag or path.name == "component.py":  # a KFP interface: its signature and its
                start = node.body[1].lineno  # Args: docstring do not count
            if node.end_lineno - start + 1 > LONGEST:
                lines = node.end_lineno - start + 1
                too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {lines}")
    assert not too_long, "\n".join(too_long)


def _marks(node: ast.FunctionDef) -> list[str]:
    """The ``pytest.mark`` decorators of a function, as written (``pytest.mark.integration``)."""
    found = []
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if ast.unparse(target).startswith("pytest.mark."):
            found.append(ast.unparse(target))
    return found


def test_pytest_marks_decorate_tests_not_helpers():
    """A mark on a helper does nothing: the test it was meant for runs in another tier (a test
    moved below a mark once took the mark of its neighbour, and the neighbour lost its tier)."""
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    misplaced = []
    for name in (n for n in tracked if "tests" in Path(n).parts):
        for node in ast.walk(ast.parse((ROOT / name).read_text())):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("test"):
                misplaced += [f"{name}:{node.lineno} {node.name}: {m}" for m in _marks(node)]
    assert not misplaced, "\n".join(misplaced)


# Where a stage's settings live (docs/code-layout.md): <stage>/config.py, but for tiny-model's
# and import-gguf's, kept beside their builders because train/config.py imports TRL, which those
# commands never need.
CONFIG_ELSEWHERE = {"grail.train.tiny:TinyModelConfig", "grail.train.gguf:ImportGgufConfig"}


def test_every_stage_commands_settings_live_in_its_config_module():
    """One convention for the config dataclasses: a stage's command reads its settings from
    ``grail.<stage>.config``; a command that is no stage (prompt, run, submit, ...) is free."""
    from grail.cli import COMMANDS

    misplaced = [
        f"grail {name}: {path}"
        for name, command in COMMANDS.items()
        for path in command.configs
        if path.split(".")[1] in STAGES
        and path.split(":")[0].split(".")[-1] != "config"
        and path not in CONFIG_ELSEWHERE
    ]
    assert not misplaced, misplaced
    stages = {path.split(".")[1] for c in COMMANDS.values() for path in c.configs}
    assert set(STAGES) <= stages, "every stage has a command"


def test_every_package_folder_is_in_the_wheel():
    """pyproject lists the wheel's packages by name: a new folder of the library or of the
    mapped ones left out installs everywhere but in the image (the container tier found
    grail.tasks missing there: ModuleNotFoundError in the pipeline's first task)."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folders = {
        "grail." + ".".join(p.parent.relative_to(PACKAGE).parts)
        for p in PACKAGE.rglob("__init__.py")
    }
    folders = {name.rstrip(".") for name in folders}
    for name, root in MAPPED.items():
        folders |= {
            ".".join(["grail", name, *p.parent.relative_to(root).parts])
            for p in root.rglob("__init__.py")
            if "tests" not in p.parts
        }
    assert folders - listed == set()
