"""KFP components that open and close the pipeline's parent MLflow run."""

from typing import NamedTuple

from kfp import dsl

from grail.core.images import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def start_tracking(
    experiment: str,
    recipe: str,
    recipe_overrides: str,
    issues: list,
    algorithms: list,
    tiny_model: bool,
    kfp_run_id: str,
    image: str,
    checkpoint_uri: str,
    checkpoint_key: str,
    export_destination: str,
    run_name: str,
) -> NamedTuple("Started", parent_run=str, branches=list):
    """The parent MLflow run of this pipeline run ("" when tracking is off) and the branches to
    train: every issue with every algorithm. First, before any stage runs, every branch's recipe
    (with the overrides) and every place the run writes to are checked."""
    from collections import namedtuple

    from grail.components.tracking.task import start

    from grail.core.policy_issues import branches

    places = {
        "checkpoint_uri": checkpoint_uri,
        "checkpoint_key": checkpoint_key,
        "export_destination": export_destination,
        "run_name": run_name,
    }
    parent = start(
        experiment,
        recipe,
        kfp_run_id,
        image,
        algorithms,
        issues,
        tiny_model,
        recipe_overrides,
        places,
    )
    return namedtuple("Started", "parent_run branches")(parent, branches(issues, algorithms))


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def finish_tracking(experiment: str, kfp_run_id: str):
    """Mark this pipeline run's parent MLflow run finished (at exit, whatever the outcome)."""
    from grail.components.tracking.task import finish

    finish(experiment, kfp_run_id)
