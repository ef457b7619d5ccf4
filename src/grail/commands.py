"""What each ``grail`` command does with its parsed configs, and what it prints: one function
per subcommand, ``cmd_NAME(configs, given)`` (`configs`: the command's dataclasses, parsed;
`given`: the fields the command line or recipe set). :mod:`grail.cli` parses and dispatches."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import ClassVar, Literal

from grail.core.config import option
from grail.core.errors import GrailError


def cmd_simulate(configs: list, given: set[str]) -> None:
    from grail.tasks import TASKS

    (config,) = configs
    study = TASKS[config.task].simulate
    print(
        "\n".join(
            study(
                config.out,
                config.participants,
                config.documents,
                config.seed,
                config.layout,
                config.choices,
            )
        )
    )


def cmd_clean(configs: list, given: set[str]) -> None:
    from grail.clean.stage import clean
    from grail.tasks import TASKS

    (config,) = configs
    report = clean(**asdict(config))
    print(TASKS[config.task].cleaned(report, config.out))
    for warning in report.get("accounting", {}).get("warnings", []):
        print(f"grail clean: warning: {warning}", file=sys.stderr)


def cmd_audit(configs: list, given: set[str]) -> None:
    from grail.tasks import TASKS, recorded_task

    (config,) = configs
    task = TASKS[recorded_task(config.path)]
    if task.audit is None:
        raise GrailError(f"{config.path}: the {task.name} task has no audit of its rows")
    print(task.audit(config.path, config.json))


@dataclass(kw_only=True)
class ShowPromptConfig:
    """grail prompt: print the prompt of one row (with the PromptOptions given)."""

    path: str | None = option("Cleaned folder or one parquet file in the contract.", None)
    row: int = option("Row number (0-based).", 0)
    split: Literal["train", "validation"] | None = option("Index rows within one split.", None)

    POSITIONAL: ClassVar[tuple[str, ...]] = ("path",)

    def __post_init__(self):
        if not self.path:
            raise GrailError("the following argument is required: path")


def cmd_prompt(configs: list, given: set[str]) -> None:
    from grail.tasks import TASKS, recorded_task

    show, options = configs
    task = TASKS[recorded_task(show.path)]
    if task.show_prompt is None:
        raise GrailError(f"{show.path}: the {task.name} task has no prompt of one row to show")
    print(task.show_prompt(show.path, show.split, show.row, options))


SHOWN = ("--row", "--split")  # grail prompt's own options beside a training recipe's


def trains(argv: list[str]) -> bool:
    """Whether ``grail prompt``'s `argv` names a training recipe (``--config`` with a key that
    is neither the prompt's nor the command's own): its prompt is then built as training builds
    it (:func:`cmd_prompt_of_recipe`). An unreadable recipe is left to the usual parse."""
    from grail.core.recipes import read_recipe
    from grail.tasks import task_options

    if "--config" not in argv[:-1]:
        return False
    try:
        keys = set(read_recipe(argv[argv.index("--config") + 1]))
    except (GrailError, OSError):
        return False
    shown = {
        f.name for kind in (ShowPromptConfig, task_options("recipe_fields")) for f in fields(kind)
    }
    return bool(keys - shown)


def cmd_prompt_of_recipe(argv: list[str]) -> None:
    """``grail prompt [PATH] --config TRAIN_RECIPE [--row N] [--split S] [--key value ...]``:
    row N as the recipe's training asks it (and the benchmark, which asks a model as its
    ``prompt.json`` says it was trained): the recipe's prompt fields, and its ``dataset`` unless
    PATH is given. The recipe and the other options are checked as ``grail train`` checks them
    (an unknown key is an error)."""
    from grail.tasks import TASKS, recorded_task, task_options
    from grail.train.config import parse_train_args

    shown, rest, path = {}, [], None
    words = iter(argv)
    for word in words:
        name, _, value = word.partition("=")
        if name in SHOWN:
            shown[name[2:]] = value or next(words, "")
        elif path is None and not rest and not word.startswith("-"):
            path = word
        else:
            rest.append(word)
    config, _ = parse_train_args(rest)
    show = ShowPromptConfig(
        path=path or config.dataset,
        row=int(shown.get("row", 0)),
        split=shown.get("split") or None,
    )
    options = task_options("recipe_fields")
    asked = options(**{f.name: getattr(config, f.name) for f in fields(options)})
    task = TASKS[recorded_task(show.path)]
    print(task.show_prompt(show.path, show.split, show.row, asked))


def cmd_tiny_model(configs: list, given: set[str]) -> None:
    from grail.train.tiny import build_tiny_model

    (config,) = configs
    out = build_tiny_model(**asdict(config))
    print(f"wrote a tiny {config.task} model and its tokenizer to {out}")


def cmd_import_gguf(configs: list, given: set[str]) -> None:
    from grail.train.gguf import import_gguf

    (config,) = configs
    done = import_gguf(config.gguf, config.out)
    print(
        f"wrote {done['architecture']} ({done['parameters']:,} parameters, replies end at "
        f"{done['end_of_turn']}) and its tokenizer to {done['out']}"
    )


def cmd_benchmark(configs: list, given: set[str]) -> None:
    from grail.benchmark.stage import run

    config, options = configs
    # a prompt field the recipe or the command line sets overrides how each model was trained
    prompt = {f.name: getattr(options, f.name) for f in fields(options) if f.name in given}
    run(**asdict(config), prompt=prompt)
    out = Path(config.out)
    print((out / "report.md").read_text())
    written = sorted(p.name for p in out.iterdir() if not p.name.startswith((".", "_")))
    print(f"wrote {config.out}/" + ", ".join(written))


def cmd_compare(configs: list, given: set[str]) -> None:
    from grail.benchmark.stage import compare

    (config,) = configs
    compare(config.results, config.out, config.bootstrap)
    print((Path(config.out) / "comparison.md").read_text())
    print(f"wrote {config.out}/comparison.json, comparison.md")


def cmd_counterfactual(configs: list, given: set[str]) -> None:
    from grail.tasks import TASKS, recorded_task

    (config,) = configs
    task = TASKS[recorded_task(config.data)]
    if task.counterfactual is None:
        raise GrailError(f"{config.data}: the {task.name} task has no counterfactual sessions")
    results = task.counterfactual(config)
    print((Path(config.out) / "report.md").read_text())
    seconds = results["settings"]["seconds"]
    print(f"wrote {config.out}/counterfactual.json, report.md, outcomes.svg ({seconds} s)")


def cmd_generate(configs: list, given: set[str]) -> None:
    from grail.generate.stage import run

    config, options = configs
    summary = run(**asdict(config), options=options)
    print(json.dumps(summary, indent=1))
    print(f"wrote {config.out}/generated.parquet, sft.parquet, preferences.parquet, summary.json")


def cmd_export(configs: list, given: set[str]) -> None:
    from grail.core.config import parse_params
    from grail.export.stage import export

    (config,) = configs
    result = export(
        config.model,
        config.benchmark,
        config.dest,
        run_ids=parse_params(config.run_ids),
        keep_stale=config.keep_stale,
        checkpoint=config.checkpoint,
    )
    exported = result["manifest"].get("exported") or {}
    if exported.get("step") is not None:
        print(f"exported step {exported['step']}: {exported['reason']}")
    print(
        f"exported to {config.dest}: {len(result['uploaded'])} uploaded, "
        f"{len(result['skipped'])} unchanged, {len(result['deleted'])} no longer exported deleted"
    )


def cmd_compile(configs: list, given: set[str]) -> None:
    from grail.core.errors import GrailError
    from grail.launch.compile import compile_pipeline
    from grail.tasks import BUILT_IN

    (config,) = configs
    if config.out and not config.task:
        raise GrailError("--out names one file: give the --task whose DAG it is")
    for task in [config.task] if config.task else BUILT_IN:
        print(f"wrote {compile_pipeline(config.out, task)}")


def cmd_run(configs: list, given: set[str]) -> None:
    from grail.launch.local import run_local
    from grail.tasks import TASKS

    (config,) = configs
    if not config.local:
        raise GrailError(
            "only --local runs here; on a cluster use `grail submit` or "
            "`kfp run create -e EXPERIMENT -f pipelines/grail.yaml`"
        )
    where = run_local(config)
    lines = [
        f"\nlocal run {where['run']} ({' and '.join(where['algorithms'])}) finished in "
        f"{where['seconds']} s: {where['folder']}\n"
    ]
    closing_table = TASKS[config.task].closing_table
    lines.append(closing_table(where["branches"], where["comparison"]) + "\n")
    for row in where["branches"]:
        branch = f"{row['issue']} {row['algorithm']}"
        pad = " " * len(branch)
        lines.append(f"{branch}: report {row['report']}")
        lines += [f"{pad}  chart  {chart}" for chart in row["charts"]]
        if branch in where["models"]:
            lines.append(f"{pad}  model  {where['models'][branch]}")
        if branch in where.get("counterfactual", {}):
            lines.append(f"{pad}  counterfactual  {where['counterfactual'][branch]}")
    if where.get("comparison_report"):
        lines.append(f"comparison: {where['comparison_report']}")
    lines += [f"export: {where['export']}", f"log: {where['log']}", where["mlflow"]]
    # not print(): kfp.local may leave print() patched to indent (logging_utils.indented_print)
    sys.stdout.write("\n".join(lines) + "\n")


def cmd_submit(configs: list, given: set[str]) -> None:
    from grail.launch.submit import submit

    (config,) = configs
    run_id = submit(config)
    where = f" (namespace {config.namespace})" if config.namespace else ""
    print(f"created run {run_id} in experiment {config.experiment} on {config.host}{where}")


def cmd_doctor(configs: list, given: set[str]) -> None:
    from grail.launch.doctor import doctor

    checks = doctor(configs[0])
    for check in checks:
        print(check.line())
    missing = [c.name for c in checks if not c.ok]
    if missing:
        raise GrailError(f"{len(missing)} of {len(checks)} checks failed: {', '.join(missing)}")
    print(f"all {len(checks)} checks passed")
