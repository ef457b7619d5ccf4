"""The task registry: every task has every part, the stages reach a task through it alone, and
a third task is a folder plus one entry. A toy task ("parity": is the number even?) is built
here from the registry's parts alone and run through simulate, clean, the training examples,
the rewards and the tiny model's warm-up; none of the stages knows its name."""

from __future__ import annotations

import ast
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

from grail.tasks import PARTS, TASKS, TaskEntry, recorded_task

ROOT = Path(__file__).resolve().parents[1]
TOY = {
    "__init__.py": """
        PARTS = {
            "simulate": "toy:simulate", "clean": "toy:clean", "cleaned": "toy:cleaned",
            "rewards": "toy:REWARDS", "check_training": "toy:check_training",
            "default_rewards": "toy:DEFAULT_REWARDS", "reward_notes": "toy:REWARD_NOTES",
            "examples": "toy:examples", "prompt_record": "toy:prompt_record",
            "before_training": "toy:before_training",
            "warmup_conversations": "toy:conversations", "warm_up": "toy:warm_up",
            "answer_samples": "toy:ANSWER_SAMPLES", "warmup_targets": "toy:TARGETS",
            "trains_with_api": "toy:TRAINS_WITH_API",
            "warmup_steps": "toy:STEPS", "gail": "toy:GAIL", "tracked_rows": "toy:tracked_rows",
            "branch_rows": "toy:branch_rows", "audit_markdown": "toy:audit_markdown",
            "audit_counts": "toy:audit_counts", "clean_params": "toy:clean_params",
            "branch_subjects": "toy:branch_subjects", "embedded": "toy:DEFAULTS",
            "embedded_arguments": "toy:arguments", "notes": "toy:NOTES",
            "version_story": "toy:version_story", "generation": "toy:GENERATION",
            "promotion": "toy:promotion", "benchmark": "toy:NOT_HERE",
            "benchmark_metrics": "toy:NOT_HERE", "benchmark_fields": "toy:NOT_HERE",
            "headline": "toy:NOT_HERE", "closing_table": "toy:NOT_HERE",
            "compare": "toy:NOT_HERE", "compare_headline": "toy:NOT_HERE",
            "counterfactual": "toy:NOT_HERE",
        }
    """,
    "toy.py": """
        import json
        from pathlib import Path

        import pyarrow as pa
        import pyarrow.parquet as pq

        from grail.core.rewards import completion_text
        from grail.core.warmup import teach_replies

        ANSWER_SAMPLES = ["even", "odd"]
        TARGETS = ("uniform",)
        NOT_HERE = None  # the benchmark's parts: this test runs no benchmark
        TRAINS_WITH_API = False
        STEPS = 2
        GAIL = False
        GENERATION = None  # no generate stage


        def tracked_rows(path, issue):
            return pq.read_table(path).to_pandas(), None


        def branch_rows(dataset, issue, scratch):
            return dataset, str(dataset)


        def audit_markdown(report):
            return f"# {report['rows']} numbers"


        def audit_counts(report):
            return {"rows": report["rows"]}


        def clean_params(config, participants, documents):
            return {"synthetic": documents}


        def branch_subjects(issues):
            return ["numbers"]


        DEFAULTS = {"recipe": "parity.yaml", "algorithms": ["grpo"], "max_steps": 2,
                    "mlflow_experiment": "parity", "folder": "parity-"}


        def arguments(config):
            return {"documents": config.documents}


        from grail.core.run_notes import Notes

        NOTES = Notes(("accuracy",), ("| numbers |", "|---|"), lambda *a: "| row |", "none")


        def version_story(summary, issue, algorithm, run, fingerprint, sources):
            return f"parity on {issue}", {}


        def promotion(summary):
            return summary.get("accuracy", 0) > 0.5, "more than half right"


        def simulate(out, participants, documents, seed, layout):
            Path(out).mkdir(parents=True)
            numbers = [(seed * 7 + k * 13) % 100 for k in range(documents)]
            (Path(out) / "numbers.json").write_text(json.dumps(numbers))
            return [f"wrote {documents} numbers to {out}"]


        def clean(raw, out, config):
            numbers = json.loads((Path(raw) / "numbers.json").read_text())
            Path(out).mkdir(parents=True)
            rows = [{"n": n, "split": "validation" if k % 5 == 0 else "train"}
                    for k, n in enumerate(numbers)]
            for split in ("train", "validation"):
                part = [r for r in rows if r["split"] == split]
                pq.write_table(pa.Table.from_pylist(part), Path(out) / f"{split}.parquet")
            audit = {"task": "parity", "rows": len(rows)}
            (Path(out) / "audit.json").write_text(json.dumps(audit))
            return audit


        def cleaned(report, out):
            return f"{report['rows']} numbers in {out}"


        def parity_reward(prompts, completions, n, **_):
            truth = ["even" if k % 2 == 0 else "odd" for k in n]
            return [float(completion_text(c).strip() == t) for c, t in zip(completions, truth)]


        REWARDS = {"parity": parity_reward}
        DEFAULT_REWARDS = ["parity"]
        REWARD_NOTES = {"parity": "1 when the answer is the number's parity (optimal: right)"}


        def check_training(fields):
            if fields.gail_use:
                raise ValueError("gail_use: parity has no discriminator")


        def examples(config, folder, split, limit):
            rows = pq.read_table(Path(folder) / f"{split}.parquet").to_pylist()[:limit]
            return [{"prompt": [{"role": "user", "content": f"Is {r['n']} even or odd?"}],
                     "n": r["n"]} for r in rows]


        def prompt_record(config):
            return {"max_new_tokens": config.max_completion_length}


        def before_training(config, weights, dataset):
            return None


        def conversations(data, limit=3000):
            rows = pq.read_table(Path(data) / "train.parquet").to_pylist()[:limit]
            return [[{"role": "user", "content": f"Is {r['n']} even or odd?"},
                     {"role": "assistant", "content": "even" if r["n"] % 2 == 0 else "odd"}]
                    for r in rows]


        def warm_up(model, tokenizer, chats, steps, seed, data, target):
            return teach_replies(model, tokenizer, chats, steps, seed)
    """,
}


@pytest.fixture
def parity(tmp_path, monkeypatch):
    """The toy task's folder on the path and its one entry in the registry."""
    package = tmp_path / "toy_tasks" / "parity"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    for name, text in TOY.items():
        (package / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = TaskEntry("parity", "toy_tasks.parity", json_parts(package))
    monkeypatch.setitem(TASKS, "parity", entry)
    yield entry
    for name in [m for m in sys.modules if m.startswith("toy_tasks")]:
        del sys.modules[name]


def json_parts(package: Path) -> dict:
    scope: dict = {}
    exec((package / "__init__.py").read_text(), scope)  # noqa: S102 (the test's own file)
    return scope["PARTS"]


def test_every_task_has_every_part_and_each_resolves():
    """Each part is there; only one whose description allows it ("None where the task has
    none", "or None") is None."""
    for name, entry in TASKS.items():
        assert set(entry.parts) == set(PARTS), name
        for part in PARTS:
            allowed = "None where" in PARTS[part]
            assert getattr(entry, part) is not None or allowed, f"{name}.{part}"


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
