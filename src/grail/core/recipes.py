"""Recipes: the YAML files of a command's fields. The shipped ones are package data
(``grail.recipes``, the repository's ``recipes/``); a path that exists is used as it is."""

from __future__ import annotations

import json
from pathlib import Path

from grail.core.config import find_recipe, read_recipe
from grail.core.errors import GrailError
from grail.core.policy_issues import short_name


def resolve_recipe(recipe: str, issue: str, algorithm: str) -> Path:
    """A recipe, with ``{issue}`` (gun/wage) and ``{algorithm}`` filled in
    (:func:`grail.core.config.find_recipe`: a path, else a shipped recipe)."""
    return find_recipe(recipe.format(issue=short_name(issue), algorithm=algorithm))


def overrides_values(overrides: str) -> dict:
    """The recipe overrides (a JSON object; "" is none), or one line saying what is wrong."""
    try:
        values = json.loads(overrides or "{}")
    except json.JSONDecodeError as err:
        raise GrailError(f"recipe_overrides: not JSON ({err.msg})") from None
    if not isinstance(values, dict):
        raise GrailError(f"recipe_overrides must be a JSON object, got {overrides!r}")
    return values


def overrides_to_args(overrides: str) -> list[str]:
    """``{"max_steps": 10, "issues": ["a"]}`` -> ``["--max_steps", "10", "--issues", "a"]``."""
    args = []
    for key, value in overrides_values(overrides).items():
        items = value if isinstance(value, list) else [value]
        args += [f"--{key}", *(json.dumps(v) if isinstance(v, bool) else str(v) for v in items)]
    return args


# Recipe fields that are places on one machine, not settings: never params (a temp path means
# nothing in a comparison); the datasets are MLflow dataset inputs instead.
PLACE_FIELDS = ("output_dir", "dataset", "logging_dir", "checkpoint_uri", "sft_dataset")


TINY = "tiny (offline, built from the dataset)"


def recipe_values(recipe_path: Path, overrides: str, tiny: bool) -> dict[str, str]:
    """A recipe as it will run (file + overrides), as MLflow params: settings, not places."""

    values = read_recipe(recipe_path) | overrides_values(overrides)
    skip = set(PLACE_FIELDS) | ({"model_name_or_path", "gail_model"} if tiny else set())
    return {
        key: json.dumps(value) if isinstance(value, list | dict) else str(value)
        for key, value in values.items()
        if key not in skip
    }


def base_model(values: dict[str, str], tiny: bool) -> str:
    return TINY if tiny else values.get("model_name_or_path", "unknown")
