"""Configuration: one dataclass per stage, one parser for all of them.

Every ``grail`` command is parsed by :func:`parse_config`: TRL's ``TrlParser`` (transformers'
``HfArgumentParser``) over the command's dataclasses, so each field is an option (``--a_b`` and
``--a-b`` both work) with the help and the default written once, on the field (:func:`option`).
``--config RECIPE`` reads a flat YAML file of the same fields first; the command line overrides
it; a class may name environment variables for its fields (``ENVIRONMENT``; precedence: recipe
< environment < command line). An unknown key, in the recipe or on the command line, and a value
of the wrong kind are errors naming them, before anything runs.

The stages' dataclasses live with their stages; training's (TRL's ``GRPOConfig`` extended with
grail's fields, and TRL's ``ModelConfig``) is :class:`grail.train.config.TrainConfig`, its own
fields in :mod:`grail.train.fields`. Run ``grail train --help`` for every field with its help.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import typing
from dataclasses import MISSING, field, fields
from typing import Any

from grail.core.errors import GrailError, OutOfRange
from grail.core.recipes import read_recipe


class _ExtendGiven(argparse.Action):
    """argparse's ``extend``, except that the first values given replace the field's own
    default rather than add to it: ``--algorithm grpo`` is ``["grpo"]``, not the default
    ``["grpo", "grail"]`` plus ``grpo``. A recipe's list is still extended (``models: [m1]``
    and ``--model m2`` are both benchmarked). argparse puts the default object itself in the
    namespace, so a value that is still the field's default object was not given."""

    def __init__(self, *args, default=None, **kwargs):
        super().__init__(*args, default=default, **kwargs)
        self.field_default = default  # a recipe's value replaces self.default, not this

    def __call__(self, parser, namespace, values, option_string=None):
        current = getattr(namespace, self.dest, None)
        kept = [] if current is None or current is self.field_default else list(current)
        setattr(namespace, self.dest, kept + list(values))


def option(help: str, default: Any = MISSING, **argparse_options) -> Any:
    """A config field: its help text, its default (a list default is copied per instance;
    none means required) and extra ``add_argument`` options such as ``action="extend"`` (a
    repeatable list option: its values replace the default, extend a recipe's) or ``metavar``."""
    if argparse_options.get("action") == "extend":
        argparse_options["action"] = _ExtendGiven
    metadata = {"help": help, **argparse_options}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _accepts(kind, value) -> bool:
    """Whether a recipe value fits a field's type (recipes are YAML: lists, numbers, text); a
    Literal field's value must be one of its choices.

    >>> import typing
    >>> _accepts(typing.Literal["warn", "stop"], "halt"), _accepts(typing.Literal["warn"], "warn")
    (False, True)
    >>> [_accepts(int, v) for v in (4, "4", 4.0, 2.7, True)], _accepts(float, True)
    ([True, True, False, False, False], False)
    >>> [_accepts(int | None, v) for v in (None, 3, True, 1.5, "x")]
    [True, True, False, False, False]
    """
    import types
    import typing

    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(k, value) for k in typing.get_args(kind))
    if value is None or kind is type(None):  # `None` fits only an optional field's None
        return value is None and kind is type(None)
    if origin is typing.Literal:  # argparse checks choices on the command line, not a recipe's
        return str(value) in {str(choice) for choice in typing.get_args(kind)}
    if origin in (list, tuple) or kind in (list, tuple):
        return True  # one value or a list: the parser makes a list of either
    if origin is dict or kind is dict:
        return isinstance(value, dict | str)
    if isinstance(value, list | dict):
        return False
    if kind is bool:
        return isinstance(value, bool) or str(value).lower() in ("true", "false")
    if isinstance(value, bool) and kind in (int, float):
        return False  # YAML's true is no number (``max_steps: true`` would train 1 step)
    if kind is int:  # integers are integers: 2.7 or 4.0 would fail inside the trainer
        return isinstance(value, int) or re.fullmatch(r"[+-]?[0-9]+", str(value)) is not None
    if kind is float:
        try:
            return float(value) == float(value)
        except (TypeError, ValueError):
            return False
    return True


def as_lists(values: dict, types: tuple) -> dict:
    """A recipe's one value for a list field made a list of one (``reward_funcs: log_score``,
    ``models: m1``): argparse takes a recipe's value as the field's default as it is, and a
    string would be read as its characters (``unknown reward 'l'``)."""
    import types as kinds

    hints: dict = {}
    for kind in types:
        hints |= typing.get_type_hints(kind)

    def is_list(kind) -> bool:  # a list, and no text of its own (``str | list[str]`` is not)
        origin = typing.get_origin(kind)
        if origin in (typing.Union, kinds.UnionType):
            members = typing.get_args(kind)
            return str not in members and any(is_list(k) for k in members)
        return origin is list or kind is list

    return {
        key: [value] if value is not None and not isinstance(value, list | tuple)
        and key in hints and is_list(hints[key]) else value
        for key, value in values.items()
    }  # fmt: skip


INTEGER = re.compile(r"-?[0-9]+")  # as typed: ASCII digits (int() takes "٣", "６０", "6_0", " 6")


def _is_int_field(kind) -> bool:
    """An int field, or an optional one (``int | None``)."""
    import types as kinds

    if typing.get_origin(kind) in (typing.Union, kinds.UnionType):
        members = [k for k in typing.get_args(kind) if k is not type(None)]
        return members == [int]
    return kind is int


def check_command_line_ints(argv: list[str], types: tuple) -> None:
    """An int option's value as typed on the command line is ASCII digits: argparse's
    ``int()`` reads ``"٣"`` as 3, ``"６０"`` as 60, ``"6_0"`` as 60 and ``" 6"`` as 6.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Options:
    ...     rows: int | None = option("Rows.", None)
    >>> check_command_line_ints(["--rows", "12", "--rows=-1"], (Options,))
    >>> check_command_line_ints(["--rows", "١٢"], (Options,))
    Traceback (most recent call last):
    grail.core.errors.GrailError: --rows: expected int, got '١٢' (ASCII digits 0-9)
    """
    hints: dict = {}
    for kind in types:
        hints |= typing.get_type_hints(kind)
    renamed = _renamed(types)
    for k, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        name, equals, value = token[2:].partition("=")
        if not equals:
            if k + 1 >= len(argv):
                continue
            value = argv[k + 1]
        key = name.replace("-", "_")
        key = renamed.get(key, key)
        if key in hints and _is_int_field(hints[key]) and not INTEGER.fullmatch(value):
            raise GrailError(f"--{key}: expected int, got {value!r} (ASCII digits 0-9)")


def check_recipe_types(values: dict, source: str, types: tuple) -> None:
    """A value of the wrong kind (``learning_rate: [1, 2]``) is an error naming the key, before
    any model is loaded."""
    hints: dict = {}
    for kind in types:
        hints |= typing.get_type_hints(kind)
    for key, value in values.items():
        if key in hints and not _accepts(hints[key], value):
            raise GrailError(f"{source}: {key}: {value!r} is not a valid value for this field")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description's paragraphs kept as written; after each help text its default, unless
    the text gives it (``(default: ...)``) or there is none; required options say so."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.required:
            return f"{text} (required)"
        if action.default in (None, argparse.SUPPRESS) or "(default" in text:
            return text
        return f"{text} (default: %(default)s)"


def check_finite(instance) -> None:
    """Refuse NaN and infinity in any float field of a parsed dataclass (a list's items too):
    they pass every comparison a range check makes (``nan < 0`` is False) and would train a
    model of NaN weights. Raised as :class:`OutOfRange` naming the field, so that the parser
    says where the value came from.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Options:
    ...     history_depth: int = option("Most recent videos shown.", 12)
    >>> options = Options()
    >>> options.history_depth = float("nan")
    >>> check_finite(options)
    Traceback (most recent call last):
    grail.core.errors.OutOfRange: history_depth must be a finite number, got nan
    """
    for name in (f.name for f in fields(instance)):
        value = getattr(instance, name, None)
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, float) and not math.isfinite(item):
                raise OutOfRange(name, f"{name} must be a finite number, got {value}")


def check_seeds(instance) -> None:
    """Refuse a negative seed (a field named ``seed`` or ``*_seed``): NumPy's generators take
    none, and the command would fail with a traceback after starting its work.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Options:
    ...     split_seed: int = option("Seed.", 1)
    >>> check_seeds(Options(split_seed=-1))
    Traceback (most recent call last):
    grail.core.errors.OutOfRange: split_seed: expected 0 or more, got -1
    """
    for name in (f.name for f in fields(instance)):
        value = getattr(instance, name, None)
        seed = name == "seed" or name.endswith("_seed")
        if seed and isinstance(value, int) and value < 0:
            raise OutOfRange(name, f"{name}: expected 0 or more, got {value}")


def _refuse(message: str):
    """argparse's error (a bad value, a missing argument): one line naming the option, the
    value and what was expected, raised instead of the usage and exit."""
    message = re.sub(r"invalid (\w+) value: (.*)", r"expected \1, got \2", message)
    raise GrailError(message)


def build_parser(types: tuple, prog: str, description: str | None = None, positional=()):
    """The command's parser: TRL's TrlParser over `types`, plus the positional arguments named
    (each also accepted as ``--NAME``)."""
    from trl import TrlParser

    parser = TrlParser(
        types,
        prog=prog,
        description=description,
        formatter_class=_HelpFormatter,
        allow_abbrev=False,  # an abbreviated option is an unknown one, as in a recipe
    )
    parser.error = _refuse
    parser.add_argument(
        "--config",
        metavar="RECIPE",
        default=argparse.SUPPRESS,
        help="YAML file of these fields, read first; options given here override it",
    )
    helps = {f.name: f.metadata.get("help") for kind in types for f in fields(kind)}
    for name in positional:
        parser.add_argument(name, nargs="?", default=argparse.SUPPRESS, help=helps[name])
    return parser


def _renamed(types: tuple) -> dict[str, str]:
    return {old: new for kind in types for old, new in getattr(kind, "RENAMED", {}).items()}


def given_names(argv: list[str], types: tuple) -> set[str]:
    """The fields an argument list sets (``--a-b``, ``--a_b=1``, ``--no_a``).

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Options:
    ...     history_depth: int = option("Most recent videos shown.", 12)
    ...     show_ids: bool = option("Show video ids.", False)
    >>> sorted(given_names(["--show-ids", "--history_depth=2", "x"], (Options,)))
    ['history_depth', 'show_ids']
    """
    known = {f.name for kind in types for f in fields(kind)}
    renamed = _renamed(types)
    names = set()
    for token in argv:
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0].replace("-", "_")
            name = renamed.get(name, name)
            if name not in known and name.startswith("no_"):
                name = name[3:]
            names.add(name)
    return names & known


def parse_config(
    types: tuple, argv: list[str], prog: str, description: str | None = None, positional=()
) -> tuple[list, set[str]]:
    """Parse ``[--config RECIPE] [--field value ...]`` into one instance of each of `types`;
    returns them and the names of the fields the recipe, the environment or the command line
    set (the rest kept their defaults)."""
    parser = build_parser(types, prog, description, positional)
    argv = list(argv)
    values: dict = {}
    source = "command line"
    if "--config" in argv:
        at = argv.index("--config")
        if at + 1 >= len(argv):
            raise GrailError("--config needs a recipe path")
        source = argv[at + 1]
        values = read_recipe(source)
        del argv[at : at + 2]
    renamed = _renamed(types)
    values = {renamed.get(key, key): value for key, value in values.items()}
    for kind in types:
        environment = getattr(kind, "ENVIRONMENT", {})
        values |= {key: os.environ[env] for key, env in environment.items() if env in os.environ}
    check_recipe_types(values, source, types)
    values = as_lists(values, types)
    check_command_line_ints(argv, types)
    unknown = parser.set_defaults_with_config(**values)[::2]
    if unknown:
        raise GrailError(
            f"{source}: unknown recipe key {unknown[0][2:]!r}"
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
        )
    try:
        *parsed, extra = parser.parse_args_into_dataclasses(
            args=argv, return_remaining_strings=True
        )
        for instance in parsed:  # every command's floats and seeds, not only training's
            check_finite(instance)
            check_seeds(instance)
    except OutOfRange as err:  # the dataclasses' own checks: say where the value came from
        environment = {k: v for t in types for k, v in getattr(t, "ENVIRONMENT", {}).items()}
        if err.field in given_names(argv, types):
            origin = "command line"
        elif environment.get(err.field, "") in os.environ:
            origin = f"${environment[err.field]}"
        else:
            origin = source
        raise GrailError(f"{origin}: {err}") from None
    except ValueError as err:
        raise GrailError(str(err)) from None
    except TypeError as err:  # a required field given neither in the recipe nor as an option
        raise GrailError(f"{prog}: {err}") from None
    if extra:
        raise GrailError(f"unknown option {extra[0]!r}")
    return parsed, set(values) | given_names(argv, types)


def parse_params(pairs: list[str], types: dict[str, str] | None = None) -> dict:
    """``key=value`` pairs, typed by the pipeline's declaration when given: a STRING parameter
    keeps its text (``gpu_count=8`` stays "8"), others are parsed as JSON. Without types,
    values are parsed as JSON when they are. Unknown keys are an error naming the key."""
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise GrailError(f"--param {pair!r}: expected key=value")
        if types is not None and key not in types:
            raise GrailError(f"--param {key}: the pipeline has no such parameter")
        kind = (types or {}).get(key)
        if kind == "STRING":
            params[key] = value
            continue
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            if kind is not None:
                raise GrailError(f"--param {key}: {value!r} is not a {kind} (JSON)") from None
            params[key] = value
    return params
