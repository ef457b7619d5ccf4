"""The compare component on its own: the shared checks (tests/component_checks.py) and its
body's task with fakes in place of KFP's artifacts and of the stage."""

from component_checks import FakeArtifact, FakeMetrics, folder_tests, recorder
from grail.components.compare.component import compare

test_readme, test_args, test_metadata, test_one_call, test_task_call = folder_tests(
    __file__, [compare]
)


def test_its_task_reads_every_branch_and_logs_the_differences(tmp_path, monkeypatch):
    """run_compare hands compare_task every branch's path and logs what it returns."""
    from grail.components.compare import task

    values = {"compare/gun_control/grail_minus_grpo/log_loss": -0.01}
    fake = recorder(values)
    monkeypatch.setattr(task, "compare_task", fake)
    results = [FakeArtifact(tmp_path / "a"), FakeArtifact(tmp_path / "b")]
    comparison, report, metrics = (
        FakeArtifact(tmp_path / "c"),
        FakeArtifact(tmp_path / "r"),
        FakeMetrics(),
    )
    task.run_compare(
        results=results, parent_run="p", comparison=comparison, report=report, metrics=metrics
    )
    assert fake.calls == [(([r.path for r in results], "p", comparison.path, report.path), {})]
    assert metrics.logged == values
