"""MLflow runs for pipeline stages.

Two ways, chosen from the environment:

- KFP >= 2.17 with its MLflow plugin: the task already has ``KFP_MLFLOW_CONFIG`` and
  ``MLFLOW_RUN_ID`` (a nested run per task): every stage logs into that run.
- Otherwise (and locally): :func:`start_pipeline_run` makes one parent run per pipeline run,
  named for what ran (:func:`run_name`), with the resolved recipe, algorithm, issues, base model
  and image as params (the clean stage adds the data fingerprint, the benchmark the headline
  metrics per issue); :func:`stage_run` makes a nested run per stage, issue and algorithm
  (``train:gun_control:grail``) under it, and points ``MLFLOW_RUN_ID`` at it while the stage
  runs, so transformers' MLflow integration and the benchmark log there.

Nothing happens when ``MLFLOW_TRACKING_URI`` is unset.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from grail.core.run_notes import (
    KIND_TAG,
    MODEL_TRAINING,
    VIEW_TAG,
    Notes,
    headline_view,
    write_parent_note,
)


def enabled() -> bool:
    return bool(os.environ.get("MLFLOW_TRACKING_URI"))


def kfp_plugin_run() -> str | None:
    """The task's own run when KFP's MLflow plugin set one up."""
    if os.environ.get("KFP_MLFLOW_CONFIG") and os.environ.get("MLFLOW_RUN_ID"):
        return os.environ["MLFLOW_RUN_ID"]
    return None


def git_commit() -> str:
    if os.environ.get("GRAIL_GIT_COMMIT"):
        return os.environ["GRAIL_GIT_COMMIT"]
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_name(recipe: str, algorithm: str, kfp_run_id: str) -> str:
    """The parent run's name: what ran (the recipe family and algorithm) and which run.

    >>> run_name("recipes/tiny/config_{algorithm}.yaml", "grail", "5740717")
    'grail-tiny-grail-5740717'
    >>> run_name("recipes/Qwen2.5-1.5B-Instruct/grpo/config_{algorithm}_{issue}.yaml", "grpo",
    ...          "0f5e2c1a-9b7d-4c1e-8a53-3d1f2b0c9e77")
    'grail-Qwen2.5-1.5B-Instruct-grpo-0f5e2c1a'
    >>> run_name("my_recipe.yaml", "grpo", "")
    'grail-my_recipe-grpo'
    >>> run_name("recipes/tiny/config_{algorithm}.yaml", "grpo+grail", "20261123-195526")
    'grail-tiny-grpo+grail-20261123-195526'
    """
    parts = [p for p in PurePosixPath(recipe).with_suffix("").parts if p != "recipes"]
    family = parts[0] if len(parts) > 1 else parts[-1]
    # a KFP run id is a UUID: its first group names it; a local run's id is short already
    uuid = len(kfp_run_id) == 36 and kfp_run_id.count("-") == 4
    short = kfp_run_id.split("-")[0] if uuid else kfp_run_id
    return "-".join(p for p in ("grail", family, algorithm, short) if p)


def _client():
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def start_pipeline_run(
    experiment: str,
    name: str,
    params: dict[str, str],
    tags: dict[str, str],
    headline_fields: tuple[str, ...] = (),
) -> str:
    """Create the parent run of a pipeline run; returns its id ("" when tracking is off, or
    when KFP's plugin made the parent: then the params go to that one). `headline_fields`:
    the task's headline metrics, the columns of the experiment's saved view."""
    if not enabled():
        return ""
    client = _client()
    if kfp_plugin_run():
        log_params(pipeline_parent(""), params)
        return ""
    found = client.get_experiment_by_name(experiment)
    # Without an artifact location, a sqlite store puts artifacts in ./mlruns of whatever folder
    # the task runs in; `grail run --local` points GRAIL_MLFLOW_ARTIFACTS under --outputs.
    location = os.environ.get("GRAIL_MLFLOW_ARTIFACTS") or None
    kind = {KIND_TAG: MODEL_TRAINING}  # MLflow 3 opens an untagged experiment as GenAI's
    if found is None:
        experiment_id = client.create_experiment(experiment, location, tags=kind)
    else:
        experiment_id = found.experiment_id
        if KIND_TAG not in found.tags:  # a kind someone chose stays
            client.set_experiment_tag(experiment_id, KIND_TAG, MODEL_TRAINING)
    branches = [params.get("issues", "").split(","), params.get("algorithms", "").split(",")]
    previous = found.tags.get(VIEW_TAG) if found else None
    view = headline_view(*branches, headline_fields, previous)
    client.set_experiment_tag(experiment_id, VIEW_TAG, view)
    run = client.create_run(experiment_id, run_name=name, tags={"git_commit": git_commit()} | tags)
    log_params(run.info.run_id, params)
    return run.info.run_id


def pipeline_parent(parent_run_id: str) -> str:
    """The pipeline run's parent run: ours, or the one KFP's plugin made above this task's."""
    if parent_run_id or not enabled():
        return parent_run_id
    own = kfp_plugin_run()
    if not own:
        return ""
    return _client().get_run(own).data.tags.get("mlflow.parentRunId", "")


def log_params(run_id: str, params: dict) -> None:
    """Params (values cut to MLflow's 6000 characters); nothing when there is no run."""
    if run_id and enabled() and params:
        from mlflow.entities import Param

        _client().log_batch(
            run_id, params=[Param(k, str(v)[:6000]) for k, v in sorted(params.items())]
        )


def log_metrics(run_id: str, values: dict[str, float], step: int | None = None) -> None:
    """Metrics into a run by id (a parent's headline, a stage's counts)."""
    if run_id and enabled() and values:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        _client().log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, step or 0) for k, v in sorted(values.items())],
        )


def set_tags(run_id: str, tags: dict[str, str]) -> None:
    """Tags on a run by id (values cut to MLflow's 5000 characters); nothing without a run."""
    if run_id and enabled() and tags:
        from mlflow.entities import RunTag

        _client().log_batch(
            run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in sorted(tags.items())]
        )


@contextmanager
def stage_run(parent_run_id: str, name: str, params: dict | None = None):
    """Run a stage inside its MLflow run; yields the run id (None when tracking is off)."""
    own = kfp_plugin_run()
    if not enabled() or (not own and not parent_run_id):
        yield None
        return
    client = _client()
    if own:
        run_id = own
    else:
        parent = client.get_run(parent_run_id)
        run_id = client.create_run(
            parent.info.experiment_id,
            run_name=name,
            tags={"mlflow.parentRunId": parent_run_id, "grail.stage": name.split(":")[0]},
        ).info.run_id
    log_params(run_id, params or {})
    status = "FAILED"
    try:
        with environment_variable("MLFLOW_RUN_ID", run_id):
            yield run_id
        status = "FINISHED"
    finally:
        if not own:
            client.set_terminated(run_id, status)


@contextmanager
def environment_variable(name: str, value: str):
    """`name` set to `value` for the block; what was there before (or nothing) afterwards."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def finish_pipeline_run(
    experiment: str, kfp_run_id: str, notes_of: Callable[[str | None], Notes]
) -> None:
    """End the parent run of a pipeline run, found by its ``kfp_run_id`` tag (an exit task may
    not depend on the task that created it), with its description in its task's words
    (`notes_of`: the task's :class:`grail.core.run_notes.Notes`, by the run's task param)."""
    if not enabled() or kfp_plugin_run():
        return
    client = _client()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return
    for run in client.search_runs(
        [found.experiment_id], filter_string=f"tags.kfp_run_id = '{kfp_run_id}'"
    ):
        if not run.data.tags.get("mlflow.parentRunId"):
            failed = any(
                r.info.status == "FAILED"
                for r in client.search_runs(
                    [found.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'"
                )
            )
            write_parent_note(run.info.run_id, notes_of)
            client.set_terminated(run.info.run_id, "FAILED" if failed else "FINISHED")


@contextmanager
def trainer_params_off():
    """While a stage trains: transformers' MLflow callback logs none of its ~300
    TrainingArguments and model-config params (temporary paths among them), as the stage run
    already has the recipe's values. ``grail train`` on its own keeps them."""
    with environment_variable("MLFLOW_MAX_LOG_PARAMS", "0"):
        yield


def log_artifacts(run_id: str | None, paths: list[Path], folder: str) -> None:
    """Files (those that exist) as a run's artifacts under `folder`."""
    if run_id and enabled():
        client = _client()
        for path in paths:
            if Path(path).is_file():
                client.log_artifact(run_id, str(path), artifact_path=folder)


def log_nested_run(metrics: list[tuple[str, float, int]], folder: Path, artifact_path: str) -> None:
    """Metrics (key, value, step) and a folder's files (under `artifact_path`) into a run nested
    in the active one (or into the ``MLFLOW_RUN_ID`` run when none is active)."""
    import mlflow

    with mlflow.start_run(nested=mlflow.active_run() is not None):
        for key, value, step in metrics:
            mlflow.log_metric(key, value, step=step)
        mlflow.log_artifacts(str(folder), artifact_path=artifact_path)
