"""What ``grail run --local`` changes of ``kfp.local`` (2.17) while a run lasts, each undone
after it (docs/pins.md#kfp-217): the run's id and folder (kfp.local draws both at random), the
one local image every task of a DockerRunner run uses (kfp.local hands Docker the unresolved
image placeholder), and a line per task on the terminal. Every patch of kfp lives here, each
upstream function it stands on pinned in :data:`UPSTREAM` (:mod:`grail.core.pins`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

# "module:qualified name" of each kfp function the patches below replace or rely on -> (the
# first 16 hex digits of the sha256 of its source at kfp 2.17.0, why grail depends on it)
UPSTREAM = {
    "kfp.local.pipeline_orchestrator:_run_local_pipeline_implementation": (
        "b4bc9403f7779bdf",
        "replaces what it reads through module attributes: the run's folder "
        "(executor_input_utils.get_local_pipeline_resource_name) and its id "
        "(placeholder_utils.make_random_id)",
    ),
    "kfp.local.executor_input_utils:get_local_pipeline_resource_name": (
        "2229bd98aa4f6cb2",
        "replaces it while a run lasts: the run's folder under the pipeline root",
    ),
    "kfp.local.placeholder_utils:make_random_id": (
        "6274721bff8e26de",
        "replaces it for the orchestrator while a run lasts: the run's id (its job id)",
    ),
    "kfp.local.orchestrator.task_executor:execute_single_task": (
        "ee78ffed032b5fdd",
        "wraps what it calls through the module: task_dispatcher.run_single_task_implementation",
    ),
    "kfp.local.task_dispatcher:run_single_task_implementation": (
        "352b81d11542f64a",
        "wraps it while a run lasts (a line per task, its arguments read by keyword); it looks "
        "docker_task_handler.DockerTaskHandler up when a task runs",
    ),
    "kfp.local.docker_task_handler:DockerTaskHandler.__init__": (
        "09beb474ce8efc71",
        "subclasses it while a DockerRunner run lasts: its image keyword replaced",
    ),
}


def upstream_changes(source: Callable[[str], str] | None = None) -> list[str]:
    """Each :data:`UPSTREAM` function whose source changed since it was pinned."""
    from grail.core.pins import changed_since_pinned, source_of

    return changed_since_pinned(UPSTREAM, source or source_of)


@contextmanager
def every_task_wrapped(wrap: Callable):
    """While a run lasts, every task kfp.local runs goes through ``wrap(run_task)`` (kfp.local's
    ``run_single_task_implementation``, called by keyword)."""
    from kfp.local import task_dispatcher

    original = task_dispatcher.run_single_task_implementation
    task_dispatcher.run_single_task_implementation = wrap(original)
    try:
        yield
    finally:
        task_dispatcher.run_single_task_implementation = original


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
