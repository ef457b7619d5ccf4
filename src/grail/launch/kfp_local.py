"""What ``grail run --local`` changes of ``kfp.local`` (2.17) while a run lasts, each undone
after it (docs/pins.md#kfp-217): the run's id and folder (kfp.local draws both at random), and
the one local image every task of a DockerRunner run uses (kfp.local hands Docker the
unresolved image placeholder)."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def local_run_identity(run: str, folder: str):
    """While kfp.local runs the pipeline: `run` as its job id (``dsl.PIPELINE_JOB_ID_PLACEHOLDER``:
    MLflow's ``kfp_run_id``, the export folder) and `folder` as its folder under the pipeline
    root. kfp.local draws both at random (docs/pins.md#kfp-217)."""
    import types

    from kfp.local import executor_input_utils, pipeline_orchestrator, placeholder_utils

    ids = types.ModuleType(placeholder_utils.__name__)
    ids.__dict__.update(vars(placeholder_utils))
    ids.make_random_id = lambda: run
    named = executor_input_utils.get_local_pipeline_resource_name
    pipeline_orchestrator.placeholder_utils = ids
    executor_input_utils.get_local_pipeline_resource_name = lambda pipeline_name: folder
    try:
        yield
    finally:
        pipeline_orchestrator.placeholder_utils = placeholder_utils
        executor_input_utils.get_local_pipeline_resource_name = named


@contextmanager
def local_image_for_every_task(image: str):
    """Run every task of a kfp.local DockerRunner run in `image`.

    The DAG sets each task's image from a pipeline parameter (``image``, ``train_image``), which
    the KFP backend resolves per pod; kfp.local passes the unresolved placeholder to Docker
    instead (docs/pins.md#kfp-217), so its task handler gets the one local image here; the
    compiled DAG stays the same.
    """
    from kfp.local import docker_task_handler

    original = docker_task_handler.DockerTaskHandler

    class OneImage(original):
        def __init__(self, image: str, **kwargs):
            super().__init__(image=chosen if image.startswith("{{$") else image, **kwargs)

    chosen = image
    docker_task_handler.DockerTaskHandler = OneImage
    try:
        yield
    finally:
        docker_task_handler.DockerTaskHandler = original
