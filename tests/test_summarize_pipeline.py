"""The summarize task's DAG run whole on this machine (``grail run --local --task summarize``),
against a real MLflow server: the same stages and tracking as the slate task's, answering
"did training help?" by questions answered (issue 43)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def summarize_run(mlflow_server, tmp_path_factory):
    outputs = tmp_path_factory.mktemp("summarize-run")
    env = os.environ | {"MLFLOW_TRACKING_URI": mlflow_server, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "grail.cli", "run", "--local", "--task", "summarize"]
        # 8 steps, not the demo's 60: the same DAG, checkpoints and benchmark of step 0, a
        # checkpoint and the final model, in a third of the training's time
        + ["--outputs", str(outputs), "--max-steps", "8"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, outputs


def test_the_summarize_dag_answers_did_training_help(summarize_run):
    """The closing table gives the final model's share answered with its interval, step 0's,
    the paired change, the best baseline and the ceilings, and says in words whether training
    beat step 0, as the interval says."""
    out, outputs = summarize_run
    assert "train            summarize grpo       SUCCESS" in out, out
    assert "compare" not in out  # one algorithm: nothing to compare
    row = re.search(
        r"summarize  grpo +(\d\.\d{3}) \[(\d\.\d\d), (\d\.\d\d)\] +(\d\.\d{3}) +"
        r"([+-]\d\.\d{3}) \[([+-]\d\.\d{3}), ([+-]\d\.\d{3})\] +(\w+) (\d\.\d{3}) +"
        r"1\.000/1\.000",
        out,
    )
    assert row, out
    final, start, change = float(row[1]), float(row[4]), float(row[5])
    low, high = float(row[6]), float(row[7])
    assert change == pytest.approx(final - start, abs=2e-3)
    verdict = re.search(r"^grpo: (.*)$", out, re.MULTILINE)[1]
    if low > 0:
        assert verdict == "beats its step 0 (the interval excludes zero)"
    elif high < 0:
        assert verdict == "is worse than its step 0 (the interval excludes zero)"
    else:
        assert verdict == "does not beat its step 0 (the interval includes zero)"
    assert row[8] in ("lead_k", "random_k", "tfidf_centrality")
    results = json.loads(next(outputs.rglob("benchmark-*/results/metrics.json")).read_text())
    assert results["task"] == "summarize" and results["documents"] == 91
    steps = sorted(
        s["step"] for s in results["systems"].values() if s.get("series") == results["trained"]
    )
    assert steps[0] == 0 and len(steps) >= 3  # step 0, a checkpoint, the final model
    assert set(results["charts"]) == {"answered_by_model.svg", "answered_vs_step.svg"}


def test_the_summarize_run_is_tracked_and_exported(summarize_run, mlflow_server):
    from mlflow.tracking import MlflowClient

    out, outputs = summarize_run
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("grail-local-summarize")
    runs = client.search_runs([experiment.experiment_id], max_results=50)
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.data.params["task"] == "summarize"
    note = parent.data.tags["mlflow.note.content"]
    assert "| summarize | grpo |" in note and "bootstrap over documents" in note
    stages = {r.info.run_name: r for r in runs if r is not parent}
    assert set(stages) >= {
        "clean",
        "train:summarize:grpo",
        "benchmark:summarize:grpo",
        "export:summarize:grpo",
    }
    bench = stages["benchmark:summarize:grpo"].info.run_id
    history = client.get_metric_history(bench, "trained_by_step/answered")
    assert [m.step for m in history][0] == 0 and len(history) >= 3
    for key in ("trained/answered", "baseline/lead_k/answered", "ceiling/oracle/answered"):
        assert key in stages["benchmark:summarize:grpo"].data.metrics, key
    artifacts = {a.path for a in client.list_artifacts(bench, "benchmark")}
    assert "benchmark/answered_vs_step.svg" in artifacts and "benchmark/report.md" in artifacts
    headline = parent.data.metrics
    assert "summarize/grpo/answered" in headline and "summarize/grpo/start_answered" in headline
    run = parent.data.tags["kfp_run_id"]
    exported = outputs / "export" / run / "grpo" / "summarize"
    manifest = json.loads((exported / "manifest.json").read_text())
    assert (exported / "benchmark" / "metrics.json").is_file()
    # how the model is asked, pinned: mode, budget, length, reader and judge (none here)
    assert manifest["asked_as"]["task"] == "summarize"
    assert manifest["asked_as"]["summary_mode"] == "extractive"
    assert manifest["asked_as"]["summary_reader"] is None
    assert f"local run {run} (grpo)" in out
