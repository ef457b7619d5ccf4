"""The comparison of algorithms per issue, and exports that never replace another run's."""

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from grail.components.export.task import export_location, export_task

from grail.core.errors import GrailError
from grail.core.outputs import mark_complete
from grail.core.recipes import branches
from grail.export.stage import MANIFEST
from grail.tasks.slate.benchmark.compare import compare, compare_headline, markdown

PEOPLE = 40


def _branch(folder: Path, issue: str, algorithm: str, hit: float, spread: float) -> Path:
    """A benchmark output of one branch: `hit` of the person's choices get probability
    `spread` + the rest shared; every participant has 3 steps."""
    folder.mkdir(parents=True)
    trained = f"{algorithm}-{issue}"
    records = []
    for k in range(PEOPLE * 3):
        person, step = divmod(k, 3)
        gold = 1 + (k % 2)
        right = (k * 7919) % 100 < hit * 100
        p = [spread, 1 - spread] if (gold == 1) == right else [1 - spread, spread]
        records.append(
            {
                "system": f"{trained}@step-10",
                "series": trained,
                "step": 10,
                "session_id": f"s{person}",
                "step_index": step,
                "participant_id": f"p{person}",
                "gold_index": gold,
                "correct": right,
                "distribution": p,
                "log_loss": -math.log(p[gold - 1]),
            }
        )
    pq.write_table(pa.Table.from_pylist(records), folder / "predictions.parquet")
    final = {"kind": "model", "series": trained, "step": 10, "accuracy": hit, "log_loss": 0.6}
    start = {"kind": "model", "series": trained, "step": 0, "accuracy": 0.3, "log_loss": 0.7}
    result = {
        "branch": {"issue": issue, "algorithm": algorithm},
        "trained": trained,
        "systems": {f"{trained}@step-0": start, f"{trained}@step-10": final},
    }
    (folder / "metrics.json").write_text(json.dumps(result))
    mark_complete(folder, "benchmark")  # as the benchmark stage finishes one
    return folder


def test_comparison_pairs_the_algorithms_on_the_same_rows(tmp_path):
    grpo = _branch(tmp_path / "a", "gun_control", "grpo", hit=0.5, spread=0.6)
    grail = _branch(tmp_path / "b", "gun_control", "grail", hit=0.9, spread=0.9)
    wage = _branch(tmp_path / "c", "minimum_wage", "grail", hit=0.5, spread=0.6)
    result = compare([grail, grpo, wage], replicates=300)
    gun = result["issues"]["gun_control"]
    assert list(gun["algorithms"]) == ["grpo", "grail"]  # GRPO first: differences are GRAIL - GRPO
    difference = gun["differences"]["grail_minus_grpo"]
    assert difference["accuracy"]["difference"] == pytest.approx(0.4, abs=0.05)
    low, high = difference["log_loss"]["ci"]
    assert high < 0 and difference["log_loss"]["difference"] < 0  # GRAIL finds the choices likelier
    assert gun["participants"] == PEOPLE and gun["rows"] == 3 * PEOPLE
    assert gun["algorithms"]["grpo"]["start"] == {"accuracy": 0.3, "log_loss": 0.7}
    assert result["issues"]["minimum_wage"]["differences"] == {}  # one algorithm: nothing to pair
    assert "grail − grpo" in markdown(result) and "participants" in result["intervals"]
    assert compare_headline(result)["compare/gun_control/grail_minus_grpo/accuracy"] > 0.3


def test_comparison_refuses_different_rows_and_unnamed_results(tmp_path):
    grpo = _branch(tmp_path / "a", "gun_control", "grpo", hit=0.5, spread=0.6)
    grail = _branch(tmp_path / "b", "gun_control", "grail", hit=0.9, spread=0.9)
    table = pq.read_table(grail / "predictions.parquet").slice(0, 30)
    pq.write_table(table, grail / "predictions.parquet")
    mark_complete(grail, "benchmark")  # a benchmark of fewer rows, as written
    with pytest.raises(GrailError, match="different rows"):
        compare([grpo, grail], replicates=10)
    (grail / "metrics.json").write_text(json.dumps({"systems": {}}))
    mark_complete(grail, "benchmark")
    with pytest.raises(GrailError, match="names no branch"):
        compare([grail], replicates=10)


def test_branches_are_every_issue_with_every_algorithm():
    assert branches(["gun_control", "minimum_wage"], ["grpo"]) == [
        {"issue": "gun_control", "algorithm": "grpo"},
        {"issue": "minimum_wage", "algorithm": "grpo"},
    ]
    for wrong in ([], ["ppo"], ["grpo", "grpo"]):
        with pytest.raises(GrailError, match="algorithms"):
            branches(["gun_control"], wrong)


def test_two_runs_and_two_algorithms_into_one_destination_keep_every_export(tmp_path):
    """The rerun of a pipeline from the UI, or its other algorithm, never deletes an export."""
    destination = str(tmp_path / "exports")
    written = {}
    for run in ("run-1", "run-2"):
        for algorithm in ("grpo", "grail"):
            model = tmp_path / run / algorithm / "model"
            model.mkdir(parents=True)
            (model / "config.json").write_text(json.dumps({"run": run, "algorithm": algorithm}))
            results = tmp_path / run / algorithm / "results"
            results.mkdir()
            (results / "report.md").write_text(f"# {run} {algorithm}")
            manifest = tmp_path / run / algorithm / "manifest.json"
            export_task(
                model=str(model),
                results=str(results),
                destination=destination,
                run=run,
                issue="gun_control",
                algorithm=algorithm,
                parent="",
                out=str(manifest),
            )
            written[(run, algorithm)] = export_location(destination, run, algorithm, "gun_control")
    for (run, algorithm), where in written.items():
        config = json.loads((Path(where) / "model" / "config.json").read_text())
        assert config == {"run": run, "algorithm": algorithm}
        assert (Path(where) / MANIFEST).is_file()
        assert (Path(where) / "benchmark" / "report.md").read_text() == f"# {run} {algorithm}"
    with pytest.raises(GrailError, match="without '/'"):
        export_location(destination, "a/b", "grpo", "gun_control")


def test_comparison_never_reads_a_benchmark_edited_since_it_was_written(tmp_path, capsys):
    """An edited predictions.parquet or metrics.json (the marker not refreshed) moved the
    grail - grpo difference from +0.000 to -0.562 unseen; a metrics.json that is not a JSON
    object was a traceback. Each is one line, exit 2, nothing written."""
    from grail.cli import main
    from grail.core.outputs import mark_complete

    grpo = _branch(tmp_path / "a", "gun_control", "grpo", hit=0.5, spread=0.6)
    grail = _branch(tmp_path / "b", "gun_control", "grail", hit=0.5, spread=0.6)
    table = pq.read_table(grail / "predictions.parquet").slice(0, 30)
    pq.write_table(table, grail / "predictions.parquet")
    argv = ["compare", "--results", str(grpo), str(grail), "--out", str(tmp_path / "cmp")]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "predictions.parquet is not the file benchmark wrote" in line, line
    (grail / "metrics.json").write_text("[]")
    (grail / "_COMPLETE.json").unlink()  # a folder made or edited by hand: not trusted
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "no _COMPLETE.json: not a finished benchmark" in line, line
    mark_complete(grail, "benchmark")  # marked as written: still read, and checked
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "metrics.json: not a benchmark's metrics (not a JSON object)" in line, line
    assert not (tmp_path / "cmp").exists()
