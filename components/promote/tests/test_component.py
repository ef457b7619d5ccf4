"""The promote component on its own: the shared checks (tests/component_checks.py), and its
task deciding on constructed benchmarks of both tasks, for both outcomes."""

import json

import pytest
from component_checks import FakeArtifact, FakeMetrics, folder_tests
from constructed_benchmarks import slate_benchmark, summarize_benchmark
from grail.components.promote.component import promote

from grail.core.errors import GrailError
from grail.core.outputs import mark_complete

test_readme, test_args, test_metadata, test_one_call, test_task_call = folder_tests(
    __file__, [promote]
)


@pytest.mark.parametrize(
    ("result", "rule", "promoted", "reason"),
    [
        (slate_benchmark(-0.002), "beats_prior", True, "beats always-first: log-loss -0.017"),
        (slate_benchmark(0.008), "beats_prior", False, "no better than always-first"),
        (slate_benchmark(-0.01, "one answer"), "beats_prior", False, "collapsed: one answer"),
        (summarize_benchmark(0.61), "beats_prior", True, "beats lead_k (0.600): answered 0.660"),
        (summarize_benchmark(0.58), "beats_prior", False, "no better than lead_k (0.600)"),
        (slate_benchmark(0.008), "always", True, "promote_if: always"),
        (summarize_benchmark(0.9), "never", False, "promote_if: never"),
    ],
)
def test_it_decides_on_the_benchmark_by_the_rule(tmp_path, result, rule, promoted, reason):
    """The task reads the benchmark's metrics.json, writes its decision and returns it: a slate
    model only when its paired log-loss interval against always-first is wholly below 0 and it
    did not collapse; a summarizer only when its interval's lower end is above the best
    baseline's share."""
    from grail.components.promote import task

    results = tmp_path / "results"
    results.mkdir()
    (results / "metrics.json").write_text(json.dumps(result))
    mark_complete(results, "benchmark")
    decision, metrics = FakeArtifact(tmp_path / "decision.json"), FakeMetrics()
    returned = task.run_promote(
        results=FakeArtifact(results), promote_if=rule, issue="gun_control", algorithm="grpo",
        parent_run="", decision=decision, metrics=metrics,
    )  # fmt: skip
    written = json.loads((tmp_path / "decision.json").read_text())
    assert returned == (promoted, written["reason"]) and written["promoted"] is promoted
    assert written["reason"].startswith(reason) and written["rule"] == rule
    assert metrics.logged == {"promoted": int(promoted)}


def test_an_unknown_rule_or_a_missing_benchmark_is_one_line(tmp_path):
    from grail.components.promote.task import gate

    (tmp_path / "metrics.json").write_text(json.dumps(slate_benchmark(-0.01)))
    mark_complete(tmp_path, "benchmark")
    with pytest.raises(GrailError, match="promote_if: 'best' is none of beats_prior"):
        gate(tmp_path, "best", tmp_path / "d.json")
    with pytest.raises(GrailError, match="no benchmark metrics to decide the promotion on"):
        gate(tmp_path / "absent", "beats_prior", tmp_path / "d.json")


def benchmarked(folder, result: dict):
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps(result))
    mark_complete(folder, "benchmark")
    return folder


def test_the_gate_never_promotes_on_an_edited_benchmark_or_a_nan(tmp_path):
    """A metrics.json edited after the benchmark wrote it (its marker not refreshed) is
    refused; a NaN paired difference or interval end is no evidence, never a promotion."""
    from grail.components.promote.task import gate

    results = benchmarked(tmp_path / "results", slate_benchmark(0.02))
    forged = slate_benchmark(-0.05)
    (results / "metrics.json").write_text(json.dumps(forged))
    with pytest.raises(GrailError, match="metrics.json is not the file benchmark wrote"):
        gate(results, "beats_prior", tmp_path / "d.json")
    for field in ("difference", "low", "high"):
        nan = slate_benchmark(-0.05)
        gap = nan["differences"]["final_minus_always_first"]["log_loss"]
        if field == "difference":
            gap["difference"] = float("nan")
        else:
            gap["ci"][field == "high"] = float("nan")
        folder = benchmarked(tmp_path / f"nan-{field}", nan)
        decision = gate(folder, "beats_prior", tmp_path / f"{field}.json")
        assert decision["promoted"] is False, (field, decision)


def test_a_decision_is_read_only_for_the_benchmark_it_decided(tmp_path):
    """The export reads the gate's decision against its own branch's benchmark: one copied from
    another branch (its model and metrics differ), one whose benchmark changed since, or one
    missing a field, is refused in one line before anything is exported."""
    from grail.components.promote.task import gate

    from grail.export.promotion import read_decision

    gun = benchmarked(tmp_path / "gun", slate_benchmark(-0.05))
    wage_result = slate_benchmark(0.05)
    wage_result["trained"] = "grpo-wage"
    wage = benchmarked(tmp_path / "wage", wage_result)
    decided = gate(gun, "beats_prior", tmp_path / "gun.json")
    assert decided["promoted"] and read_decision(tmp_path / "gun.json", gun) == decided
    with pytest.raises(GrailError, match="decided on another benchmark than .*wage"):
        read_decision(tmp_path / "gun.json", wage)
    for missing in ("reason", "model"):
        (tmp_path / "bad.json").write_text(json.dumps({**decided, missing: None}))
        with pytest.raises(GrailError, match=f"not a promotion decision \\({missing}"):
            read_decision(tmp_path / "bad.json", gun)
    (tmp_path / "bad.json").write_bytes(b"\xff")
    with pytest.raises(GrailError, match="not a promotion decision"):
        read_decision(tmp_path / "bad.json", gun)


def test_a_decision_edited_by_hand_is_refused(tmp_path):
    """A branch's own decision with promoted set to true by hand (the rule said no): the
    export reads it again from its benchmark by its rule, and refuses it."""
    from grail.components.promote.task import gate

    from grail.benchmark.stage import headline
    from grail.export.promotion import read_decision

    results = benchmarked(tmp_path / "results", slate_benchmark(0.05))
    decided = gate(results, "beats_prior", tmp_path / "d.json")
    assert not decided["promoted"]
    (tmp_path / "d.json").write_text(json.dumps(decided | {"promoted": True}))
    summary = headline(json.loads((results / "metrics.json").read_text()))
    assert read_decision(tmp_path / "d.json", results) is not None  # its fields and benchmark
    with pytest.raises(GrailError, match="says promoted: true, but its rule .* gives false"):
        read_decision(tmp_path / "d.json", results, summary)
