"""The counterfactual component on its own: the shared checks (tests/component_checks.py) and
its body's task with fakes in place of KFP's artifacts and of the stage."""

import json

from component_checks import FakeArtifact, FakeMetrics, folder_tests, recorder
from grail.components.counterfactual.component import counterfactual

test_readme, test_args, test_metadata, test_one_call, test_task_call = folder_tests(
    __file__, [counterfactual]
)


def test_its_task_gets_the_branch_and_logs_the_headline(tmp_path, monkeypatch):
    """run_counterfactual hands counterfactual_task the branch (the tiny policy's folder only
    with tiny_model), logs what it returns and puts the report and chart in their artifacts."""
    from grail.components.counterfactual import task

    values = {"cf/gun_control/grpo/slant_error/like_minded-cross_cutting": 0.01}
    fake = recorder(values)
    monkeypatch.setattr(task, "counterfactual_task", fake)
    outcomes = tmp_path / "out"
    outcomes.mkdir()
    (outcomes / "report.md").write_text("# gun")
    (outcomes / "outcomes.svg").write_text("<svg/>")
    report, charts = FakeArtifact(tmp_path / "r"), FakeArtifact(tmp_path / "c")
    metrics = FakeMetrics()
    for tiny, base in ((True, str(tmp_path / "base")), (False, "")):
        task.run_counterfactual(
            dataset=FakeArtifact(tmp_path / "d"), model=FakeArtifact(tmp_path / "m"),
            base_models=FakeArtifact(tmp_path / "base"), tiny_model=tiny, issue="gun_control",
            algorithm="grpo", recommenders=["factual"], viewers=4, steps=2, seed=0,
            parent_run="p", outcomes=FakeArtifact(outcomes), report=report, charts=charts,
            metrics=metrics,
        )  # fmt: skip
        assert fake.calls[-1][1]["base_models"] == base
    assert fake.calls[-1][1]["model"] == str(tmp_path / "m")
    assert metrics.logged == values
    assert (tmp_path / "r").read_text() == "# gun" and "<svg/>" in (tmp_path / "c").read_text()


def test_step_0_is_the_tiny_policy_or_the_local_start_the_training_names(tmp_path):
    from grail.components.counterfactual.task import start_of

    model = tmp_path / "model"
    model.mkdir()
    assert start_of(str(model), str(tmp_path / "base")) == str(tmp_path / "base" / "policy")
    assert start_of(str(model), "") is None
    (model / "summary.json").write_text(json.dumps({"start_model": str(tmp_path)}))
    assert start_of(str(model), "") == str(tmp_path)
    (model / "summary.json").write_text('{"start_model": "Qwen/Qwen2.5-1.5B-Instruct"}')
    assert start_of(str(model), "") is None
