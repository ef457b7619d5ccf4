"""The ``--set key=value`` option the bench scripts share: a recipe's fields overridden on the
command line, handed to ``grail train``'s parser as ``--key value`` (which refuses an unknown
key, as for a recipe)."""

from __future__ import annotations

import argparse


def add_set_option(parser: argparse.ArgumentParser, what: str = "the cloning recipe's") -> None:
    parser.add_argument(
        "--set",
        nargs="*",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help=f"{what} overrides (repeat --set or list several)",
    )


def as_argv(pairs: list[str]) -> list[str]:
    """``key=value`` pairs as ``grail train`` arguments.

    >>> as_argv(["bf16=true", "sft_learning_rate=2e-3"])
    ['--bf16', 'true', '--sft_learning_rate', '2e-3']
    """
    argv = []
    for key, _, value in (pair.partition("=") for pair in pairs):
        argv += [f"--{key}", value]
    return argv
