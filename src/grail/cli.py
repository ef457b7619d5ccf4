"""The ``grail`` command: one subcommand per stage, generated from the stage's config dataclass.

Run ``grail --help`` or ``grail <command> --help``. A command's options are the fields of its
config dataclass (help and default written there once), parsed by
:func:`grail.core.config.parse_config`: ``--config RECIPE`` (a YAML file of the same fields) works
for every command, and ``--a_b`` and ``--a-b`` both. Input errors print one line naming the file,
row and field and exit with status 2; ``--debug`` shows the traceback instead. What each
command does and prints: :mod:`grail.commands`.
"""

from __future__ import annotations

import importlib
import inspect
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from grail.commands import (
    cmd_audit,
    cmd_benchmark,
    cmd_clean,
    cmd_compare,
    cmd_compile,
    cmd_counterfactual,
    cmd_doctor,
    cmd_export,
    cmd_generate,
    cmd_import_gguf,
    cmd_prompt,
    cmd_prompt_of_recipe,
    cmd_run,
    cmd_simulate,
    cmd_submit,
    cmd_tiny_model,
    trains,
)
from grail.core.errors import describe, exit_without_final_collections, is_input_error
from grail.core.progress import show_progress

PROMPT = "grail.tasks:recipe_fields"  # the task's own fields: how a row is asked


@dataclass(frozen=True)
class Command:
    """A subcommand: its one-line help, the dataclasses its options come from (``module:Class``,
    or ``grail.tasks:PART``, the one a task registers as that part; imported when the command
    runs) and what it does with them."""

    help: str
    configs: tuple[str, ...]
    run: Callable[[list, set[str]], None]

    def types(self) -> tuple[type, ...]:
        from grail.tasks import task_options

        loaded = []
        for path in self.configs:
            module, name = path.split(":")
            if module == "grail.tasks":  # a task's part (grail.tasks.PARTS)
                loaded.append(task_options(name))
            else:
                loaded.append(getattr(importlib.import_module(module), name))
        return tuple(loaded)


COMMANDS = {
    "simulate": Command(
        "write a synthetic study (either task) in its raw export layout",
        ("grail.study.config:SimulateConfig",),
        cmd_simulate,
    ),
    "clean": Command(
        "raw export -> rows (a step or a document each), split, audit",
        ("grail.clean.config:CleanConfig",),
        cmd_clean,
    ),
    "audit": Command(
        "position baselines and leakage detectors", ("grail.clean.config:AuditConfig",), cmd_audit
    ),
    "prompt": Command(
        "print the prompt of one row",
        ("grail.commands:ShowPromptConfig", PROMPT),
        cmd_prompt,
    ),
    "tiny-model": Command(
        "build a tiny Qwen2 model + tokenizer offline",
        ("grail.train.tiny:TinyModelConfig",),
        cmd_tiny_model,
    ),
    "train": Command(
        "GRPO / GRAIL training: grail train --config RECIPE [--key value ...]", (), None
    ),
    "import-gguf": Command(
        "a plain model folder from a .gguf file (a real LLM offline)",
        ("grail.train.gguf:ImportGgufConfig",),
        cmd_import_gguf,
    ),
    "benchmark": Command(
        "baselines and models on a split: report, charts",
        ("grail.benchmark.config:BenchmarkConfig", PROMPT),
        cmd_benchmark,
    ),
    "compare": Command(
        "the algorithms of one run compared per issue (paired differences)",
        ("grail.benchmark.config:CompareConfig",),
        cmd_compare,
    ),
    "counterfactual": Command(
        "simulators drive sessions under other recommenders, scored against the known truth",
        ("grail.tasks:counterfactual_config",),
        cmd_counterfactual,
    ),
    "generate": Command(
        "completions from a model server (distilabel)",
        ("grail.generate.config:GenerateConfig", PROMPT),
        cmd_generate,
    ),
    "export": Command(
        "model + benchmark + manifest to S3 or a folder",
        ("grail.export.config:ExportConfig",),
        cmd_export,
    ),
    "compile": Command(
        "compile the DAGs: pipelines/grail.yaml, pipelines/summarize.yaml",
        ("grail.launch.compile:CompileConfig",),
        cmd_compile,
    ),
    "run": Command(
        "run the whole pipeline locally with kfp.local", ("grail.launch.local:RunConfig",), cmd_run
    ),
    "submit": Command(
        "create a run on a Kubeflow Pipelines cluster",
        ("grail.launch.submit:SubmitConfig",),
        cmd_submit,
    ),
    "doctor": Command(
        "check a cluster has what a run needs", ("grail.launch.doctor:DoctorConfig",), cmd_doctor
    ),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        "usage: grail [--debug] COMMAND [--config RECIPE] [--option value ...]",
        "",
        __doc__.split("\n\n")[0],
        "",
        "commands:",
        *(f"  {name:<{width}}  {command.help}" for name, command in COMMANDS.items()),
        "",
        "--debug shows tracebacks on errors. grail COMMAND --help lists the command's options.",
    ]
    return "\n".join(lines)


def run_command(name: str, argv: list[str]) -> None:
    """Parse `argv` for the command and run it."""
    from grail.core.config import parse_config

    command = COMMANDS[name]
    types = command.types()
    positional = tuple(p for kind in types for p in getattr(kind, "POSITIONAL", ()))
    description = inspect.cleandoc(types[0].__doc__ or "")
    configs, given = parse_config(types, argv, f"grail {name}", description, positional)
    command.run(configs, given)


def _stop(signum, frame):
    """SIGTERM (a pod being stopped, a kill) unwinds like an error, so half-written outputs are
    removed and the previous ones stay."""
    raise SystemExit(128 + signum)


def _default_in_child() -> None:
    """A forked child (distilabel's pool workers, multiprocessing's) dies of SIGTERM as it
    always did. With the inherited handler it could not be relied on: the kernel hands a
    process's signal to any of its threads, Python runs handlers in the main thread only, and a
    main thread blocked in a lock never runs it; a pool worker with a queue-feeder thread then
    ignored the pool's terminate, and `grail generate` hung in distilabel's teardown."""
    if signal.getsignal(signal.SIGTERM) is _stop:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


os.register_at_fork(after_in_child=_default_in_child)


def main(argv: list[str] | None = None) -> int:
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    exit_without_final_collections()  # a command is a process: it ends with the command
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return _main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = False
    while argv and argv[0] == "--debug":
        debug = True
        argv.pop(0)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"{usage()}\ngrail: error: unknown command {name!r}", file=sys.stderr)
        return 2
    if name == "train" and rest in (["--help"], ["-h"]):
        from grail.train.fields import grail_help  # grail's fields, without importing TRL

        return _guarded(lambda: print(grail_help()), debug)
    if name == "train":
        from grail.train.stage import main as train_main

        return _guarded(lambda: train_main(rest), debug)
    if name == "prompt" and trains(rest):  # a training recipe: its prompt, as training asks it
        return _guarded(lambda: cmd_prompt_of_recipe(rest), debug)
    show_progress()
    return _guarded(lambda: run_command(name, rest), debug)


def _guarded(action, debug: bool) -> int:
    try:
        action()
    except BrokenPipeError:
        return 0
    except Exception as err:  # a GrailError, or a path the user gave missing or wrong
        if debug or not is_input_error(err):
            raise
        print(f"grail: error: {describe(err)[1]}", file=sys.stderr)
        return getattr(err, "exit_code", 2)  # a failed local run: 1 when a task had a bug
    return 0


if __name__ == "__main__":
    sys.exit(main())
