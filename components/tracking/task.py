"""What the tracking tasks do: open the pipeline's parent MLflow run (its params: the
recipe resolved per branch) and close it."""

from __future__ import annotations

import json
import os

from grail.core import tracking
from grail.core.errors import GrailError, reported
from grail.core.recipes import (
    base_model,
    branches,
    overrides_values,
    read_recipe,
    recipe_values,
    resolve_recipe,
)
from grail.core.storage import check_run_name, check_uri
from grail.tasks import DEFAULT_TASK, TASKS, short_name


def run_params(
    recipe: str, overrides: str, issues: list[str], algorithms: list[str], tiny: bool, task: str
):
    """The parent run's params: the recipe resolved per issue and algorithm (fields equal for
    every branch once, the others as ``ISSUE.ALGORITHM.FIELD``), algorithms, issues and base
    model."""
    resolved = {
        f"{branch['issue']}.{branch['algorithm']}": recipe_values(
            resolve_recipe(recipe, short_name(branch["issue"]), branch["algorithm"]),
            overrides,
            tiny,
        )
        for branch in branches(issues, algorithms)
    }
    first = next(iter(resolved.values()))
    params = {
        key: value
        for key, value in first.items()
        if all(r.get(key) == value for r in resolved.values())
    }
    for branch, values in resolved.items():
        params |= {f"{branch}.{k}": v for k, v in values.items() if k not in params}
    params |= {
        "task": task,
        "recipe": recipe,
        "algorithms": ",".join(algorithms),
        "issues": ",".join(issues),
        "base_model": base_model(first, tiny),
    }
    if overrides and json.loads(overrides):
        params["recipe_overrides"] = overrides
    return params


def check_run(
    recipe: str,
    overrides: str,
    issues: list[str],
    algorithms: list[str],
    places: dict[str, str],
    task: str = DEFAULT_TASK,
) -> None:
    """What a run would otherwise find wrong only at the stage that reads it: the issue and
    algorithm lists, every branch's recipe with the overrides (keys, types, ranges, rewards:
    :func:`grail.train.config.check_recipe`), and the places it writes to (no ``..``, no
    absolute keys: :func:`grail.core.storage.check_uri`, :func:`check_run_name`)."""
    from grail.train.config import check_recipe

    extra = overrides_values(overrides)
    for branch in branches(issues, algorithms):
        path = resolve_recipe(recipe, short_name(branch["issue"]), branch["algorithm"])
        values = read_recipe(path) | extra
        check_recipe(values, f"{path} with recipe_overrides" if extra else str(path))
        recipe_task = values.get("task", DEFAULT_TASK)
        if recipe_task != task:
            raise GrailError(
                f"{path}: a recipe of task {recipe_task} in the {task} task's pipeline"
            )
    for name in ("checkpoint_uri", "export_destination"):
        if places.get(name):
            check_uri(places[name])
    for name in ("checkpoint_key", "run_name"):
        if places.get(name):
            check_run_name(places[name], name)


@reported("start-tracking")
def start(
    *,
    experiment: str,
    recipe: str,
    kfp_run_id: str,
    image: str,
    algorithms: list[str],
    issues: list[str],
    tiny: bool,
    overrides: str,
    places: dict[str, str] | None = None,
    task: str = DEFAULT_TASK,
) -> str:
    """The pipeline's parent MLflow run ("" when tracking is off or KFP's plugin tracks);
    `issues`: the branches' subjects."""
    check_run(recipe, overrides, issues, algorithms, places or {}, task)  # before anything runs
    if not tracking.enabled():
        return ""
    # where the tasks ran: a local runner (grail run --local sets GRAIL_RUNNER), else the image
    runner = os.environ.get("GRAIL_RUNNER")
    params = run_params(recipe, overrides, issues, algorithms, tiny, task)
    params |= {"runner": runner} if runner else {"image": image}
    together = "+".join(algorithms)
    return tracking.start_pipeline_run(
        experiment,
        tracking.run_name(recipe, together, kfp_run_id),
        params,
        {"kfp_run_id": kfp_run_id, "algorithms": together},
        TASKS[task].notes.fields,
    )


@reported("finish-tracking")
def finish(experiment: str, kfp_run_id: str) -> None:
    tracking.finish_pipeline_run(
        experiment, kfp_run_id, lambda task: TASKS[task or DEFAULT_TASK].notes
    )


def open_run(
    *,
    experiment: str,
    recipe: str,
    recipe_overrides: str,
    issues: list[str],
    algorithms: list[str],
    tiny_model: bool,
    kfp_run_id: str,
    image: str,
    places: dict[str, str],
    task: str,
) -> tuple[str, list[dict]]:
    """The start-tracking component's body: (the parent run, the branches to train: every
    subject of the task, its ``branch_subjects`` of `issues`, with every algorithm), after
    :func:`start` has checked every branch's recipe and every place the run writes to
    (`places`: checkpoint_uri, checkpoint_key, export_destination, run_name)."""
    subjects = TASKS[task].branch_subjects(issues)
    parent = start(
        experiment=experiment,
        recipe=recipe,
        kfp_run_id=kfp_run_id,
        image=image,
        algorithms=algorithms,
        issues=subjects,
        tiny=tiny_model,
        overrides=recipe_overrides,
        places=places,
        task=task,
    )
    return parent, branches(subjects, algorithms)
