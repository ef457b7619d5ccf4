"""Recipes: the YAML files of a command's fields. The shipped ones are package data
(``grail.recipes``, the repository's ``recipes/``); a path that exists is used as it is."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import yaml

from grail.core.errors import GrailError


def find_recipe(name: str | Path) -> Path:
    """A recipe file: `name` as a path (absolute, or from the working directory), else one of
    the shipped recipes (package data ``grail.recipes``: ``recipes/tiny/config_grpo.yaml`` or
    ``tiny/config_grpo.yaml``), so the shipped names work from any folder and in the images."""
    path = Path(name)
    if path.is_file():
        return path
    relative = Path(str(name).removeprefix("recipes/"))
    shipped = files("grail.recipes").joinpath(*relative.parts)
    if not path.is_absolute() and shipped.is_file():
        return Path(str(shipped))
    raise GrailError(f"{name}: recipe not found (in {Path.cwd()} or the shipped recipes)")


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last
    silently: `beta: 0.0` above `beta: 0.04` would train with 0.04)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def yaml_error_line(err: yaml.YAMLError) -> str:
    """One line for a YAML error: what is wrong and where (line and column, 1-based)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return f"{where}{problem}"


def read_recipe(path: str | Path) -> dict:
    """The recipe's key/values (a flat YAML mapping; a key given twice is an error)."""
    try:
        text = find_recipe(path).read_bytes().decode("utf-8")
        data = yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 (safe)
    except UnicodeDecodeError as err:
        byte = f"byte {err.start} is {err.object[err.start]:#04x}"
        raise GrailError(f"{path}: not UTF-8 text ({byte})") from None
    except yaml.YAMLError as err:
        raise GrailError(f"{path}: not valid YAML ({yaml_error_line(err)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise GrailError(f"{path}: a recipe is a flat mapping of key: value")
    return data


def resolve_recipe(recipe: str, issue: str, algorithm: str) -> Path:
    """A recipe, with ``{issue}`` (the issue's name in recipe names: gun, wage) and
    ``{algorithm}`` filled in (:func:`find_recipe`: a path, else a shipped recipe)."""
    return find_recipe(recipe.format(issue=issue, algorithm=algorithm))


ALGORITHMS = ("grpo", "grail", "bc")  # bc: behaviour cloning (recipes' rl: false)


def branches(subjects: list[str], algorithms: list[str]) -> list[dict[str, str]]:
    """What a run trains: every subject (the slate task's issues) with every algorithm
    (subject-major order), each branch keyed ``issue`` as the DAG's branches are.

    >>> branches(["gun_control"], ["grpo", "grail"])
    [{'issue': 'gun_control', 'algorithm': 'grpo'}, {'issue': 'gun_control', 'algorithm': 'grail'}]
    """
    unknown = [a for a in algorithms if a not in ALGORITHMS]
    if unknown or not algorithms or len(set(algorithms)) != len(algorithms):
        raise GrailError(
            f"algorithms: expected a list of distinct names from {', '.join(ALGORITHMS)}, "
            f"got {algorithms!r}"
        )
    if not subjects:
        raise GrailError("issues: expected at least one issue")
    return [{"issue": i, "algorithm": a} for i in subjects for a in algorithms]


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
