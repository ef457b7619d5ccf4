"""The task registry: every task has every part, the stages reach a task through it alone, and
a third task is a folder plus one entry. The toy task ("parity": is the number even?,
tests/toy_tasks/parity) runs here through simulate, clean, the training examples, the rewards and
the tiny model's warm-up, from its registry entry alone; none of the stages knows its name."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from grail.tasks import PARTS, TASKS, TaskEntry, recorded_task

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def parity(monkeypatch):
    """The toy task (tests/toy_tasks/parity, whole-DAG run: tests/test_third_task.py) and its
    one entry in the registry."""
    import toy_tasks.parity as package

    entry = TaskEntry("parity", "toy_tasks.parity", package.PARTS)
    monkeypatch.setitem(TASKS, "parity", entry)
    return entry


def test_every_task_has_every_part_and_each_resolves():
    """Each part is there; only one whose description allows it ("None where the task has
    none", "or None") is None."""
    for name, entry in TASKS.items():
        assert set(entry.parts) == set(PARTS), name
        for part in PARTS:
            allowed = "None where" in PARTS[part]
            assert getattr(entry, part) is not None or allowed, f"{name}.{part}"


def test_docs_tasks_names_every_part():
    """docs/tasks.md's "Adding a task" named 36 of the parts: a task's author reads there
    what a folder must hold; every part of grail.tasks.PARTS is named, and nothing else is
    named as one."""
    page = (ROOT / "docs" / "tasks.md").read_text().split("## Adding a task", 1)[1]
    listing = page.split("2. **One entry in the registry**", 1)[0]
    assert sorted(p for p in PARTS if f"`{p}`" not in listing) == []


def test_an_entry_missing_a_part_is_refused():
    parts = dict(TASKS["slate"].parts)
    del parts["warm_up"]
    with pytest.raises(ValueError, match=r"missing \['warm_up'\]"):
        TaskEntry("broken", "grail.tasks.slate", parts)
    with pytest.raises(AttributeError, match="has no part 'benchmarks'"):
        TASKS["slate"].benchmarks  # noqa: B018


def test_a_toy_third_task_runs_through_the_stages_from_the_registry_alone(parity, tmp_path):
    from grail.clean.stage import clean
    from grail.core.rewards import resolve_rewards
    from grail.train.examples import load_examples, prompt_record
    from grail.train.tiny import build_tiny_model

    lines = TASKS["parity"].simulate(tmp_path / "raw", None, 40, 3, "grail")
    assert lines == [f"wrote 40 numbers to {tmp_path / 'raw'}"]
    audit = clean(tmp_path / "raw", tmp_path / "clean", task="parity")
    assert audit["rows"] == 40 and recorded_task(tmp_path / "clean") == "parity"

    class Config:  # the fields training reads of a recipe
        task, dataset, output_dir = "parity", str(tmp_path / "clean"), str(tmp_path / "out")
        max_completion_length = 4

        def main_process_first(self, **_):
            import contextlib

            return contextlib.nullcontext()

    examples = load_examples(Config(), "train", 8)
    assert len(examples) == 8 and examples[0]["prompt"][0]["content"].startswith("Is ")
    assert prompt_record(Config()) == {"task": "parity", "max_new_tokens": 4}
    (reward,), _ = resolve_rewards(["parity"], None, TASKS["parity"].rewards)
    assert reward(None, ["even", "odd"], n=[4, 4]) == [1.0, 0.0]

    model = build_tiny_model(
        tmp_path / "tiny", data=str(tmp_path / "clean"), format_warmup=2, vocab_size=300,
        hidden_size=32, layers=1, heads=2,
    )  # fmt: skip
    assert (model / "config.json").is_file()
    with pytest.raises(ValueError, match="the parity task's warm-up takes uniform"):
        from grail.train.tiny import TinyModelConfig

        TinyModelConfig(out=str(tmp_path / "t2"), data=str(tmp_path / "clean"),
                        warmup_target="positions")  # fmt: skip


def test_a_dataset_names_its_task_once(tmp_path):
    (tmp_path / "audit.json").write_text(json.dumps({"task": "summarize"}))
    assert recorded_task(tmp_path) == "summarize"
    assert recorded_task(tmp_path / "none") == "slate"  # recorded before tasks were
    (tmp_path / "audit.json").write_text(json.dumps({"task": "poetry"}))
    with pytest.raises(ValueError, match="task 'poetry' is none of"):
        recorded_task(tmp_path)


TASK_NAME = re.compile(r"^(slate|summarize)$")


def task_comparisons(path: Path) -> list[int]:
    """Lines of `path` that compare a task or an issue (anything so named) with a task's name
    (==, !=, in, not in)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            names = [
                s.value for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)
            ]
            names += [
                e.value
                for s in sides
                if isinstance(s, ast.List | ast.Tuple | ast.Set)
                for e in s.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            ]
            other = " ".join(
                ast.unparse(s) for s in sides if not isinstance(s, ast.Constant)
            ).lower()
            if any(TASK_NAME.match(n) for n in names) and ("task" in other or "issue" in other):
                found.append(node.lineno)
    return found


def test_no_task_name_is_compared_outside_the_registry():
    """Stages look a task up (``TASKS[name]``); comparing its name is the task's own business
    (``grail/tasks/``)."""
    where = [ROOT / "src" / "grail", ROOT / "components", ROOT / "pipelines"]
    found = {}
    for folder in where:
        for path in folder.rglob("*.py"):
            relative = str(path.relative_to(ROOT))
            if "tests" in path.parts or relative.startswith("src/grail/tasks/"):
                continue
            lines = task_comparisons(path)
            if lines:
                found[relative] = lines
    assert found == {}


def test_the_comparison_check_finds_one(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        'if config.task == "summarize":\n    pass\nx = issues == ["summarize"]\n'
        'y = context == "slate"\nz = result.get("task") != "slate"\n'
    )
    assert task_comparisons(path) == [1, 3, 5]  # a setting's value "slate" (y) is not a task


def test_each_task_refuses_what_its_study_cannot_write(tmp_path):
    from grail.core.errors import GrailError

    with pytest.raises(GrailError, match="RepLiQA's layout only"):
        TASKS["summarize"].simulate(tmp_path / "docs", None, 3, 7, "capsule")
    assert not (tmp_path / "docs").exists()
    lines = TASKS["slate"].simulate(tmp_path / "study", 12, 3, 7, "grail")
    assert lines[0] == f"wrote a synthetic study to {tmp_path / 'study'} (grail layout)"
