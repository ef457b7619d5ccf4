"""The clean component on its own: the shared checks (tests/component_checks.py) and its
body's task with fakes in place of KFP's artifacts and of the stage."""

from pathlib import Path

from component_checks import FakeArtifact, FakeMetrics, folder_tests, recorder
from grail.components.clean.component import clean

test_readme, test_args, test_metadata, test_one_call, test_task_call = folder_tests(
    __file__, [clean]
)


def test_it_runs_alone_under_kfp_local(tmp_path, monkeypatch):
    """A real kfp.local run of the component (SubprocessRunner): a small simulated study in,
    the cleaned dataset, its audit and the row accounting out."""
    from kfp import local

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path))
    task = clean(raw_uri="", participants=40, seed=3, validation_fraction=0.25, parent_run="")
    dataset = Path(task.outputs["dataset"].path)
    assert {"train.parquet", "validation.parquet", "_COMPLETE.json"} <= {
        p.name for p in dataset.iterdir()
    }
    assert Path(task.outputs["audit"].path).read_text().startswith("# Data audit")
    logged = task.outputs["metrics"].metadata
    assert 0 < logged["rows_kept"] <= logged["rows_in"] and logged["participants_kept"] > 0


def test_its_task_fills_the_artifacts_and_logs_the_accounting(tmp_path, monkeypatch):
    """run_clean hands clean_task the artifacts' paths and logs the row accounting."""
    from grail.components.clean import task

    accounting = {"rows_in": 10, "rows_kept": 8, "participants_kept": 3}
    fake = recorder(accounting)
    monkeypatch.setattr(task, "clean_task", fake)
    dataset, audit, metrics = (
        FakeArtifact(tmp_path / "d"),
        FakeArtifact(tmp_path / "a"),
        FakeMetrics(),
    )
    task.run_clean(
        raw_uri="s3://b/raw", participants=0, seed=3, validation_fraction=0.2,
        parent_run="parent", dataset=dataset, audit=audit, metrics=metrics, task="slate",
    )  # fmt: skip
    (call,) = fake.calls
    assert call[1]["config"].out == dataset.path and call[1]["config"].seed == 3
    assert call[1]["config"].validation_fraction == 0.2 and call[1]["config"].task == "slate"
    assert (call[1]["raw_uri"], call[1]["parent"], call[1]["audit_markdown"]) == (
        "s3://b/raw",
        "parent",
        audit.path,
    )
    assert metrics.logged == accounting
