"""The clean component on its own: its README names its whole interface, and its body
calls its task module with arguments the task takes (what the pod runs, checked here)."""

from pathlib import Path

from component_checks import folder_tests
from grail.components.clean.component import clean

test_readme, test_task_call = folder_tests(__file__, [clean])


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
