"""KFP components that open and close the pipeline's parent MLflow run."""

from kfp import dsl

from grail.images import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def start_tracking(
    experiment: str,
    recipe: str,
    recipe_overrides: str,
    issues: list,
    algorithm: str,
    tiny_model: bool,
    kfp_run_id: str,
    image: str,
) -> str:
    """The parent MLflow run of this pipeline run ("" when tracking is off)."""
    from grail.tasks import start

    return start(
        experiment, recipe, kfp_run_id, image, algorithm, issues, tiny_model, recipe_overrides
    )


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def finish_tracking(experiment: str, kfp_run_id: str):
    """Mark this pipeline run's parent MLflow run finished (at exit, whatever the outcome)."""
    from grail.tasks import finish

    finish(experiment, kfp_run_id)
