"""The train component on its own: the shared checks (tests/component_checks.py) and its
body's task with fakes in place of KFP's artifacts and of the stage."""

import pytest
from component_checks import FakeArtifact, FakeMetrics, folder_tests, recorder
from grail.components.train.component import tiny_models, train

test_readme, test_args, test_metadata, test_one_call, test_task_call = folder_tests(
    __file__, [tiny_models, train]
)


POOL = {
    "nodes": 2,
    "train_image": "train:1",
    "gpu_type": "nvidia.com/gpu",
    "gpu_count": "8",
    "node_selector": {"pool": "h100"},
    "tolerations": [],
    "cpu": "32",
    "memory": "512Gi",
    "s3_secret": "s3",
    "mlflow_secret": "mlflow",
}


def _train(task, tmp_path, **given):
    from grail.components.train.task import run_train

    dataset, base, model, metrics = (
        FakeArtifact("d"),
        FakeArtifact("base"),
        FakeArtifact(tmp_path / "m"),
        FakeMetrics(),
    )
    run_train(
        dataset=dataset,
        base_models=base,
        recipe="tiny/config_{algorithm}.yaml",
        overrides="{}",
        issue="gun_control",
        algorithm="grail",
        tiny_model=given.pop("tiny", True),
        checkpoint_uri="s3://b/c",
        checkpoint_key="",
        kfp_run_id="run-1",
        parent_run="p",
        model=model,
        metrics=metrics,
        **given,
    )
    return model, metrics


def test_its_task_trains_in_the_pod_and_names_the_branch(tmp_path, monkeypatch):
    """Backend pod: train_task in this pod with the tiny models, the KFP run id as the
    checkpoint key when none is given, the final metrics logged, the branch in the model's
    metadata; a generate output becomes the recipe's sft_dataset."""
    from grail.components.train import task

    fake = recorder({"loss": 0.5, "step": 4.0})
    monkeypatch.setattr(task, "train_task", fake)
    model, metrics = _train(task, tmp_path, generated=FakeArtifact("gen"))
    assert fake.calls[0] == (
        (),
        {
            "dataset": "d",
            "recipe": "tiny/config_{algorithm}.yaml",
            "overrides": '{"sft_dataset": "gen"}',
            "issue": "gun_control",
            "algorithm": "grail",
            "base_models": "base",
            "checkpoint_uri": "s3://b/c",
            "checkpoint_key": "run-1",
            "parent": "p",
            "out": model.path,
            "runner": None,
        },
    )
    assert metrics.logged == {"loss": 0.5, "step": 4.0}
    assert model.metadata == {"issue": "gun_control", "algorithm": "grail"}


def test_its_task_builds_the_trainjob_runner_from_the_pool(tmp_path, monkeypatch):
    """Backend trainjob: the pool's settings become a TrainPool (GPU count as a number, the
    secrets by name) and the runner trains there; the tiny models are refused, since only
    this pod has them."""
    from grail.components.train import task, trainjob

    from grail.core.errors import GrailError

    fake = recorder({"loss": 0.5})
    monkeypatch.setattr(task, "train_task", fake)
    built = recorder("the runner")
    monkeypatch.setattr(trainjob, "runner_for", built)
    _train(task, tmp_path, tiny=False, backend="trainjob", **POOL)
    (backend, pool, out, branch, starting, secrets), _ = built.calls[0]
    assert (backend, pool.gpus_per_node, pool.nodes, pool.image) == ("trainjob", 8, 2, "train:1")
    assert (branch, starting, secrets) == (
        ("run-1", "gun_control", "grail"),
        False,
        {"s3": "s3", "mlflow": "mlflow"},
    )
    assert fake.calls[0][1]["runner"] == "the runner"
    monkeypatch.undo()
    with pytest.raises(GrailError, match="tiny_model and generate_data run with train_backend pod"):
        _train(task, tmp_path, tiny=True, backend="trainjob", **POOL)


def test_the_tiny_models_task_gets_the_artifacts_paths(tmp_path, monkeypatch):
    from grail.components.train import task

    fake = recorder()
    monkeypatch.setattr(task, "tiny_models_task", fake)
    models = FakeArtifact(tmp_path / "models")
    branches = [{"issue": "gun_control", "algorithm": "grpo"}]
    task.run_tiny_models(
        dataset=FakeArtifact("d"), tiny_model=True, models=models, task="slate", recipe="r",
        overrides="{}", branches=branches,
    )  # fmt: skip
    assert fake.calls == [(("d", True, str(tmp_path / "models"), "slate", "r", "{}", branches), {})]
    models = FakeArtifact(tmp_path / "m2")
    task.run_tiny_models(
        dataset=FakeArtifact("d"), tiny_model=True, models=models, task="summarize"
    )
    assert fake.calls[-1] == (("d", True, str(tmp_path / "m2"), "summarize", "", "{}", None), {})
