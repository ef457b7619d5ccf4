"""The clean component on its own: its README names its whole interface, and its body
calls its task module with arguments the task takes (what the pod runs, checked here)."""

from pathlib import Path

import pytest
from component_checks import task_calls, unbound_calls, undocumented
from grail.components.clean.component import clean

README = Path(__file__).parents[1] / "README.md"
COMPONENTS = [clean]


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.name)
def test_its_readme_names_every_input_and_output(component):
    assert undocumented(component, README) == []


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.name)
def test_its_body_calls_its_task_with_arguments_the_task_takes(component):
    modules = {module for module, _ in task_calls(component)}
    assert modules and all(
        m.startswith("grail.components.clean.")
        for m in modules - {"grail.components.train.trainjob"}
    )
    assert unbound_calls(component) == []


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
