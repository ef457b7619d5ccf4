"""MLflow runs for pipeline stages.

Two ways, chosen from the environment:

- KFP >= 2.17 with its MLflow plugin: the task already has ``KFP_MLFLOW_CONFIG`` and
  ``MLFLOW_RUN_ID`` (a nested run per task): every stage logs into that run.
- Otherwise (and locally): :func:`start_pipeline_run` makes one parent run per pipeline run,
  tagged with the KFP run id, recipe, git commit and image; :func:`stage_run` makes a nested run
  per stage (and per issue) under it, and points ``MLFLOW_RUN_ID`` at it while the stage runs,
  so transformers' MLflow integration and the benchmark log there.

Nothing happens when ``MLFLOW_TRACKING_URI`` is unset.
"""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager


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


def start_pipeline_run(experiment: str, tags: dict[str, str]) -> str:
    """Create the parent run of a pipeline run; returns its id ("" when tracking is off)."""
    if not enabled() or kfp_plugin_run():
        return ""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    found = client.get_experiment_by_name(experiment)
    # Without an artifact location, a sqlite store puts artifacts in ./mlruns of whatever folder
    # the task runs in; `grail run --local` points GRAIL_MLFLOW_ARTIFACTS under --outputs.
    location = os.environ.get("GRAIL_MLFLOW_ARTIFACTS") or None
    experiment_id = (
        found.experiment_id
        if found
        else client.create_experiment(experiment, artifact_location=location)
    )
    run = client.create_run(
        experiment_id,
        run_name=tags.get("kfp_run_id") or "grail",
        tags={"git_commit": git_commit()} | tags,
    )
    return run.info.run_id


def tag_parent(parent_run_id: str, tags: dict[str, str]) -> None:
    if parent_run_id and enabled():
        from mlflow.tracking import MlflowClient

        for key, value in tags.items():
            MlflowClient().set_tag(parent_run_id, key, value)


@contextmanager
def stage_run(parent_run_id: str, name: str, params: dict | None = None):
    """Run a stage inside its MLflow run; yields the run id (None when tracking is off)."""
    own = kfp_plugin_run()
    if not enabled() or (not own and not parent_run_id):
        yield None
        return
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    if own:
        run_id = own
    else:
        parent = client.get_run(parent_run_id)
        run_id = client.create_run(
            parent.info.experiment_id,
            run_name=name,
            tags={"mlflow.parentRunId": parent_run_id, "grail.stage": name.split(":")[0]},
        ).info.run_id
    for key, value in (params or {}).items():
        client.log_param(run_id, key, str(value)[:6000])
    previous = os.environ.get("MLFLOW_RUN_ID")
    os.environ["MLFLOW_RUN_ID"] = run_id
    status = "FAILED"
    try:
        yield run_id
        status = "FINISHED"
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_RUN_ID", None)
        else:
            os.environ["MLFLOW_RUN_ID"] = previous
        if not own:
            client.set_terminated(run_id, status)


def finish_pipeline_run(experiment: str, kfp_run_id: str) -> None:
    """End the parent run of a pipeline run, found by its ``kfp_run_id`` tag (an exit task may
    not depend on the task that created it)."""
    if not enabled() or kfp_plugin_run():
        return
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
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
            client.set_terminated(run.info.run_id, "FAILED" if failed else "FINISHED")
