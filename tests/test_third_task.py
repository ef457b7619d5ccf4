"""A third task is its folder, its registry entry and its DAG signature, nothing else.

The toy task "parity" (tests/toy_tasks/parity: is the number even or odd?) is a package of its
own, registered the way a package outside grail registers a task, through the ``grail.tasks``
entry point; it runs the whole DAG with kfp.local (simulate, clean, tiny model, train,
benchmark, promote, export) and compiles, with no line of grail naming it. The stages,
components, DAG and launchers reach every task through the registry alone: no module outside
``src/grail/tasks/`` imports a task's package."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
GRAIL = Path(sys.executable).with_name("grail")
# The packages of every layer but the tasks'; the registry (grail.tasks) is the tasks' door.
OUTSIDE_TASKS = ("src/grail", "components", "pipelines")
TASK_PACKAGES = ("grail.tasks.slate", "grail.tasks.summarize")


def imported_names(path: Path) -> list[tuple[int, str]]:
    """Every module `path` imports (at any depth, in functions too) and every dotted
    "module:attribute" string it holds (an import by name), with its line."""
    tree = ast.parse(path.read_text(), str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append((node.lineno, node.module))
            names += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names += [(node.lineno, word) for word in node.value.split() if "grail.tasks." in word]
    return names


def test_nothing_outside_the_tasks_imports_a_task():
    reaching = []
    for folder in OUTSIDE_TASKS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative.parts[:3] == ("src", "grail", "tasks") or "tests" in relative.parts:
                continue
            reaching += [
                f"{relative}:{line}: {name}"
                for line, name in imported_names(path)
                if name.startswith(TASK_PACKAGES)
            ]
    assert reaching == []


def test_the_import_check_sees_imports_in_functions_doctests_and_names(tmp_path):
    path = tmp_path / "module.py"
    path.write_text(
        "def f():\n    from grail.tasks.slate.prompts import PromptOptions\n"
        "PATH = 'grail.tasks.summarize.reader:Reader'\n"
        'def g():\n    """>>> import grail.tasks.slate.rewards"""\n'
    )
    names = [name for _, name in imported_names(path)]
    assert "grail.tasks.slate.prompts" in names
    assert "grail.tasks.summarize.reader:Reader" in names
    assert "grail.tasks.slate.rewards" in names


def install_toy(site: Path) -> dict:
    """The toy task as a package of its own: its folder and a distribution's entry point
    (``[grail.tasks] parity = toy_tasks.parity``) on a folder that PYTHONPATH names; returns
    the environment every process of the run inherits (kfp.local's tasks too)."""
    shutil.copytree(ROOT / "tests" / "toy_tasks", site / "toy_tasks")
    dist = site / "grail_parity-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: grail-parity\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[grail.tasks]\nparity = toy_tasks.parity\n")
    return os.environ | {"PYTHONPATH": str(site), "MLFLOW_TRACKING_URI": ""}


def test_the_entry_point_registers_the_toy_task(tmp_path):
    environment = install_toy(tmp_path / "site")
    shown = subprocess.run(
        [sys.executable, "-c", "from grail.tasks import TASKS, Task; "
         "print(sorted(TASKS), Task.__args__, TASKS['parity'].dag.file)"],
        env=environment, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert shown.split("\n")[0] == (
        "['parity', 'slate', 'summarize'] ('slate', 'summarize', 'parity') parity.yaml"
    )


@pytest.mark.integration
@pytest.mark.slow
def test_a_third_task_runs_the_whole_dag_from_its_folder_and_entry_point(tmp_path):
    environment = install_toy(tmp_path / "site")
    environment.pop("MLFLOW_TRACKING_URI")  # the local run's own store
    compiled = tmp_path / "parity.yaml"
    subprocess.run(
        [GRAIL, "compile", "--task", "parity", "--out", str(compiled)],
        env=environment, check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    spec, _platform = yaml.safe_load_all(compiled.read_text())  # the DAG, kfp-kubernetes
    assert spec["pipelineInfo"]["name"] == "grail-parity"
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert "documents" in inputs and "issues" not in inputs and "generate_data" not in inputs
    assert {"recipe", "algorithms", "export_destination", "train_backend"} <= set(inputs)

    done = subprocess.run(
        [GRAIL, "run", "--local", "--task", "parity", "--outputs", str(tmp_path / "out"),
         "--run-name", "toy"],
        env=environment, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for task in ("clean", "tiny-models", "train", "benchmark", "promote", "export"):
        assert any(
            line.split()[:1] == [task] and "SUCCESS" in line for line in done.stdout.splitlines()
        ), (task, done.stdout)
    assert "subject    algorithm  accuracy  step 0  always-even" in done.stdout
    export = tmp_path / "out" / "export" / "toy" / "grpo" / "numbers"
    manifest = json.loads((export / "manifest.json").read_text())
    assert (export / "model" / "config.json").is_file(), sorted(export.rglob("*"))[:20]
    assert json.loads((export / "benchmark" / "metrics.json").read_text())["task"] == "parity"
    assert manifest["promotion"]["promoted"] in (True, False)


def test_two_tasks_options_are_one_dataclass_of_both(monkeypatch):
    """A third task with recipe fields of its own: training's recipe takes both tasks' fields
    and checks each task's; a field name two tasks use is refused."""
    from dataclasses import dataclass, fields

    from grail.core.config import option
    from grail.core.errors import GrailError
    from grail.tasks import TASKS, TaskEntry, task_options

    @dataclass(kw_only=True)
    class Digits:
        digits: int = option("Digits of the numbers.", 3)

        def __post_init__(self):
            if self.digits < 1:
                raise GrailError("digits: at least 1")

    class Entry(TaskEntry):
        def __getattr__(self, part):
            return Digits if part == "recipe_fields" else None

    monkeypatch.setitem(TASKS, "digits", Entry("digits", "grail.tasks.slate", TASKS["slate"].parts))
    merged = task_options("recipe_fields")
    names = {f.name for f in fields(merged)}
    assert {"digits", "history_depth"} <= names
    with pytest.raises(GrailError, match="history_depth"):
        merged(history_depth=-1)
    with pytest.raises(GrailError, match="digits"):
        merged(digits=0)

    @dataclass(kw_only=True)
    class Clash:
        history_depth: int = 2

    monkeypatch.setattr(Entry, "__getattr__", lambda self, part: Clash if part else None)
    with pytest.raises(ValueError, match=r"fields \['history_depth'\] are two tasks' options"):
        task_options("recipe_fields")
