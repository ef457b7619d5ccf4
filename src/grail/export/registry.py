"""The model registry: each exported model registered by reference as a new version of its
branch's registered model (the version's source is the export; MLflow holds no copy), described
by the benchmark's headline in its task's words (the task's ``version_story``:
:func:`grail.tasks.slate.notes.version_story`)."""

from __future__ import annotations

import logging

from grail.core.errors import GrailError
from grail.core.run_notes import registered_model_name
from grail.tasks import DEFAULT_TASK, TASKS

logger = logging.getLogger(__name__)


def register_export(
    export_run: str,
    issue: str,
    algorithm: str,
    where: str,
    summary: dict,
    promotion: dict | None = None,
) -> str:
    """Register the MLflow model exported to `where` (s3:// or a folder) as a new version of the
    branch's registered model, by reference: the version's source is `where`, nothing is copied
    into MLflow. Its description and tags come from the benchmark's headline (`summary`); the
    export run `export_run` gets a ``model_version`` tag. `promotion`: the promotion gate's
    decision (:mod:`grail.export.promotion`): the run and the version are tagged ``promoted``
    (true or false) and ``promotion`` (why), with ``exported_step`` and ``exported_reason``
    (the checkpoint the benchmark chose: :mod:`grail.core.selection`), and only a
    promoted version gets the registered model's ``champion`` alias (an earlier champion
    keeps it otherwise). Returns ``models:/NAME/VERSION``, or "" when MLflow's server would
    refuse the source (:func:`refused_source`): a warning says so."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from grail.core.storage import Location
    from grail.export.promotion import ALIAS

    client = MlflowClient()
    decided = export_tags(summary, promotion)
    for key, value in decided.items():
        client.set_tag(export_run, key, value)
    source = str(Location.parse(where))
    name = registered_model_name(issue, algorithm)
    refused = refused_source(source)
    if refused:
        logger.warning("%s: not registered: %s", name, refused)
        client.set_tag(export_run, "model_version", f"not registered: {refused}")
        return ""
    exported = client.get_run(export_run)
    parent = client.get_run(exported.data.tags["mlflow.parentRunId"])
    stages = {
        run.info.run_name: run.info.run_id
        for run in client.search_runs(
            [exported.info.experiment_id],
            f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
        )
    }
    trained = stages.get(f"train:{issue}:{algorithm}", "")
    sources = {"train_run": trained, "export_location": source}
    benchmark = stages.get(f"benchmark:{issue}:{algorithm}")
    if benchmark:
        sources |= {
            "benchmark_run": benchmark,
            "benchmark_report": f"runs:/{benchmark}/benchmark/report.md",
        }
    task = TASKS[parent.data.params.get("task") or DEFAULT_TASK]  # the run's task
    description, tags = task.version_story(
        summary,
        issue,
        algorithm,
        parent.data.tags.get("kfp_run_id", ""),
        parent.data.params.get("dataset_fingerprint"),
        sources,
    )
    try:
        client.create_registered_model(name)
    except MlflowException as error:  # an earlier run's version is there: this one is next
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    kfp_run = parent.data.tags.get("kfp_run_id", "")
    version = version_of(name, source, kfp_run, trained or export_run, tags | decided, description)
    uri = f"models:/{name}/{version}"
    if promotion is not None and promotion["promoted"]:
        client.set_registered_model_alias(name, ALIAS, version)
    client.set_tag(export_run, "model_version", uri)
    return uri


def version_of(
    name: str, source: str, kfp_run: str, run_id: str, tags: dict, description: str
) -> str:
    """The version of `name` that `source` backs for pipeline run `kfp_run`, tagged `tags`:
    the one a retried export task of that run registered, else a new one."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    (version,) = check_source_free(name, source, kfp_run) or [None]
    if version is None:
        return client.create_model_version(
            name, source, run_id=run_id, tags=tags, description=description
        ).version
    for key, value in tags.items():  # this run's export task again: its version, not another
        client.set_model_version_tag(name, version.version, key, value)
    return version.version


def check_destination_free(parent: str, issue: str, algorithm: str, where: str) -> None:
    """Before the export task writes `where`: refuse when it already backs a model version of
    another pipeline run (:func:`check_source_free`); `parent`: this run's MLflow run."""
    from mlflow.tracking import MlflowClient

    from grail.core.storage import Location

    source = str(Location.parse(where))
    if refused_source(source):  # never registered: no version to keep
        return
    kfp_run = MlflowClient().get_run(parent).data.tags.get("kfp_run_id", "")
    check_source_free(registered_model_name(issue, algorithm), source, kfp_run)


def check_source_free(name: str, source: str, kfp_run: str) -> list:
    """The version of registered model `name` that `source` already backs for pipeline run
    `kfp_run` (a retried export task), as a list of at most one; a GrailError when it backs a
    version of another run: an export folder is the source of one version only, so a later
    run exporting there would change what that version (a champion, perhaps) serves."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        found = MlflowClient().search_model_versions(f"name = '{name}'")
    except MlflowException as error:  # no such registered model yet: nothing backed
        if error.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return []
    backed = sorted((v for v in found if v.source == source), key=lambda v: int(v.version))
    other = [v for v in backed if v.tags.get("kfp_run_id") != kfp_run]
    if other:
        raise GrailError(
            f"{source}: already the source of models:/{name}/{other[0].version} (pipeline run "
            f"{other[0].tags.get('kfp_run_id') or 'unknown'}); nothing was exported: a run "
            "name is used once per export destination, give this run another"
        )
    return backed[-1:]


def export_tags(summary: dict, promotion: dict | None) -> dict[str, str]:
    """The tags an export run and its model version get: the promotion gate's decision and the
    checkpoint exported, each with why.

    >>> export_tags({"exported_step": 2, "exported_reason": "step 2 beats"},
    ...             {"promoted": False, "reason": "no better than always-first"})["promotion"]
    'not promoted: no better than always-first'
    """
    from grail.export.promotion import in_words

    tags = {}
    if promotion is not None:
        tags = {"promoted": str(promotion["promoted"]).lower(), "promotion": in_words(promotion)}
    if summary.get("exported_step") is not None:
        tags |= {
            "exported_step": str(summary["exported_step"]),
            "exported_reason": summary.get("exported_reason", ""),
        }
    return tags


def refused_source(source: str) -> str:
    """Why MLflow's registry would refuse `source` as a model version's source ("" when it
    takes it). A tracking server (``http(s)://``) takes a local folder only inside the artifact
    folder of the version's run (``_validate_source_run`` in mlflow/server/handlers.py), which
    an export folder is not; a store MLflow opens itself (``sqlite://``, a folder, as
    ``grail run --local`` uses by default) takes it, and ``s3://`` is taken by both.

    >>> refused_source("s3://b/exports/r1/grpo/gun_control")
    ''
    """
    import mlflow

    if not source.startswith("file://"):
        return ""
    registry = mlflow.get_registry_uri()
    if not registry.startswith(("http://", "https://")):
        return ""
    return (
        f"the MLflow server {registry} refuses a local folder ({source}) as a model version "
        "source; the folder is an MLflow model all the same "
        f"(mlflow.transformers.load_model('{source}')). Export to s3:// to register it."
    )
