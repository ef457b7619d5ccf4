"""The generate component on its own: the shared checks (tests/component_checks.py) and its
body's task with fakes in place of KFP's artifacts and of the stage."""

from component_checks import FakeArtifact, FakeMetrics, folder_tests, recorder
from grail.components.generate.component import generate

test_readme, test_args, test_metadata, test_one_call, test_task_call = folder_tests(
    __file__, [generate]
)


def test_its_task_fills_the_dataset_and_logs_the_counts(tmp_path, monkeypatch):
    """run_generate hands generate_task the paths and logs the four counts, nothing else."""
    from grail.components.generate import task

    summary = {"generated": 12, "failures": 1, "acceptance_rate": 0.5, "parse_rate": 0.9, "x": 1}
    fake = recorder(summary)
    monkeypatch.setattr(task, "generate_task", fake)
    data, out, metrics = FakeArtifact(tmp_path / "d"), FakeArtifact(tmp_path / "g"), FakeMetrics()
    task.run_generate(
        dataset=data, model="openai:m@http://h/v1", num_generations=3, limit=5, parent_run="p",
        generated=out, metrics=metrics, prompt='{"summary_mode": "abstractive"}',
    )  # fmt: skip
    prompt = '{"summary_mode": "abstractive"}'
    assert fake.calls == [((data.path, "openai:m@http://h/v1", 3, 5, "p", out.path, prompt), {})]
    assert metrics.logged == {
        k: summary[k] for k in ("generated", "failures", "acceptance_rate", "parse_rate")
    }


def test_its_prompt_settings_are_refused_in_one_line_unless_known():
    import pytest
    from grail.components.generate.task import prompt_settings

    from grail.core.errors import GrailError

    assert prompt_settings("{}") == {}
    assert prompt_settings('{"max_new_tokens": 64}') == {"max_new_tokens": 64}
    for bad in ('{"temperature": 2}', "[1]", "{oops"):
        with pytest.raises(GrailError, match="prompt: "):
            prompt_settings(bad)
