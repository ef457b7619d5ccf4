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
    task: str = "slate",
) -> NamedTuple("Started", parent_run=str, branches=list):
    """Check the run before any stage runs (every branch's recipe with the overrides, every
    place it writes to), then open its parent MLflow run and list the branches to train.

    Args:
        experiment: The MLflow experiment.
        recipe: A recipe path or shipped name; {algorithm} and {issue} are filled in.
        recipe_overrides: JSON object of recipe fields that replace the recipe's.
        issues: The issues to train (gun_control, minimum_wage); empty for a task without
            issues (summarize: its branches' one subject is its documents).
        algorithms: The algorithms to train (grpo, grail, bc).
        tiny_model: The embedded default's tiny models replace the recipe's.
        kfp_run_id: The KFP run's id.
        image: The image the tasks run in, recorded on the parent run.
        checkpoint_uri: Where checkpoints go; checked before anything runs.
        checkpoint_key: The run's key under checkpoint_uri; checked likewise.
        export_destination: Where the export goes; checked likewise.
        run_name: The run's name in the export's keys; checked likewise.
        task: The run's task (slate, summarize): it names the branches' subjects (the slate
            task's issues; the summarize task's documents, one subject).

    Returns:
        parent_run: The parent MLflow run ("" when tracking is off or KFP's plugin tracks).
        branches: Every issue with every algorithm, as {issue, algorithm}.
    """
    from grail.components.tracking.task import open_run

    return open_run(
        experiment=experiment,
        recipe=recipe,
        recipe_overrides=recipe_overrides,
        issues=issues,
        algorithms=algorithms,
        tiny_model=tiny_model,
        kfp_run_id=kfp_run_id,
        image=image,
        places={
            "checkpoint_uri": checkpoint_uri,
            "checkpoint_key": checkpoint_key,
            "export_destination": export_destination,
            "run_name": run_name,
        },
        task=task,
    )


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def finish_tracking(experiment: str, kfp_run_id: str):
    """Mark this pipeline run's parent MLflow run finished, at exit, whatever the outcome.

    Args:
        experiment: The MLflow experiment.
        kfp_run_id: The KFP run's id, which names the parent run.
    """
    from grail.components.tracking.task import finish

    finish(experiment, kfp_run_id)
