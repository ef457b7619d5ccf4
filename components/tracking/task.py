"""What the tracking tasks do: open the pipeline's parent MLflow run (its params: the
recipe resolved per branch) and close it."""

from __future__ import annotations

import json
import os

from grail.core import tracking
from grail.core.errors import reported
from grail.core.issues import branches
from grail.core.recipes import (
    base_model,
    recipe_values,
    resolve_recipe,
)


def run_params(recipe: str, overrides: str, issues: list[str], algorithms: list[str], tiny: bool):
    """The parent run's params: the recipe resolved per issue and algorithm (fields equal for
    every branch once, the others as ``ISSUE.ALGORITHM.FIELD``), algorithms, issues and base
    model."""
    resolved = {
        f"{branch['issue']}.{branch['algorithm']}": recipe_values(
            resolve_recipe(recipe, branch["issue"], branch["algorithm"]), overrides, tiny
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
        "recipe": recipe,
        "algorithms": ",".join(algorithms),
        "issues": ",".join(issues),
        "base_model": base_model(first, tiny),
    }
    if overrides and json.loads(overrides):
        params["recipe_overrides"] = overrides
    return params


@reported("start-tracking")
def start(
    experiment: str,
    recipe: str,
    kfp_run_id: str,
    image: str,
    algorithms: list[str],
    issues: list[str],
    tiny: bool,
    overrides: str,
) -> str:
    """The pipeline's parent MLflow run ("" when tracking is off or KFP's plugin tracks)."""
    branches(issues, algorithms)  # a wrong list fails here, before anything runs
    if not tracking.enabled():
        return ""
    # where the tasks ran: a local runner (grail run --local sets GRAIL_RUNNER), else the image
    runner = os.environ.get("GRAIL_RUNNER")
    params = run_params(recipe, overrides, issues, algorithms, tiny)
    params |= {"runner": runner} if runner else {"image": image}
    together = "+".join(algorithms)
    return tracking.start_pipeline_run(
        experiment,
        tracking.run_name(recipe, together, kfp_run_id),
        params,
        {"kfp_run_id": kfp_run_id, "algorithms": together},
    )


@reported("finish-tracking")
def finish(experiment: str, kfp_run_id: str) -> None:
    tracking.finish_pipeline_run(experiment, kfp_run_id)
