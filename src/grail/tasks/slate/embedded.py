"""The slate task's embedded default (``grail run --local``): the tiny recipes, GRPO and GRAIL
on the chosen issues for 4 steps, a synthetic study of ``--participants``."""

from __future__ import annotations

from grail.core.errors import GrailError
from grail.tasks.slate.policy_issues import ISSUES

DEFAULTS = {
    "recipe": "recipes/tiny/config_{algorithm}.yaml",
    "algorithms": ["grpo", "grail"],
    "max_steps": 4,
    "mlflow_experiment": "grail-local",
    "folder": "",  # the local run's folder: grail-ALGORITHMS-RUN
}


def arguments(config) -> dict:
    """The slate DAG's own arguments of a local run (:class:`grail.launch.local.RunConfig`):
    the study's size and split, the issues, distinct and known (checked here, before
    anything runs), and the counterfactual sessions' viewers (0: none)."""
    unknown = [issue for issue in config.issues if issue not in ISSUES]
    if unknown or not config.issues or len(set(config.issues)) != len(config.issues):
        raise GrailError(
            f"--issues {' '.join(config.issues)}: choose distinct issues from {', '.join(ISSUES)}"
        )
    return {
        "participants": config.participants,
        "validation_fraction": config.validation_fraction,
        "issues": config.issues,
        "counterfactual_viewers": config.counterfactual_viewers,
    }
