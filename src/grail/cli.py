"""The ``grail`` command: one subcommand per stage, each a thin call into its module.

Run ``grail --help`` or ``grail <command> --help``. Input errors print one line naming the file,
row and field and exit with status 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from grail import audit as audit_module
from grail import report as report_module
from grail.errors import GrailError, mask_secrets
from grail.progress import show_progress


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (``--limit -1`` would score n - 1 rows)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text}")
    return value


def fraction(text: str) -> float:
    """An argparse type: a number on [0, 1]."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number on [0, 1], got {text}")
    return value


def add_prompt_arguments(parser: argparse.ArgumentParser, as_trained: bool = False) -> None:
    """The prompt knobs shared by prompt, benchmark and generate. With `as_trained` (benchmark)
    an option left out means "as the model was trained" (its prompt.json), else the default."""
    unset = " (default: as the model was trained, else %(default)s)" if as_trained else ""
    parser.add_argument(
        "--history-depth",
        type=int,
        default=None if as_trained else 12,
        help="videos of history in the prompt; 0 = all" + (unset or " (default 12)"),
    )
    flag = (
        {"action": "store_const", "const": True, "default": None}
        if as_trained
        else {"action": "store_true"}
    )
    parser.add_argument("--show-ids", help="show video ids in the prompt" + unset, **flag)
    parser.add_argument(
        "--shuffle-seed",
        type=int,
        default=None,
        help="shuffle the options with this seed (gold index remapped)" + unset,
    )
    parser.add_argument("--opinion", help="also ask for the opinion direction" + unset, **flag)


def prompt_overrides(args: argparse.Namespace) -> dict:
    """The prompt options given on the command line (benchmark: the rest come from the model)."""
    given = {
        "history_depth": args.history_depth,
        "show_ids": args.show_ids,
        "shuffle_seed": args.shuffle_seed,
        "opinion": args.opinion,
    }
    return {k: v for k, v in given.items() if v is not None}


def prompt_options(args: argparse.Namespace):
    from grail.prompts import PromptOptions

    return PromptOptions(
        history_depth=args.history_depth,
        show_ids=args.show_ids,
        shuffle_seed=args.shuffle_seed,
        opinion=args.opinion,
    )


def cmd_simulate(args: argparse.Namespace) -> None:
    from grail.simulate import simulate
    from grail.simulate_capsule import simulate_capsule

    write = simulate_capsule if args.layout == "capsule" else simulate
    truth = write(args.out, participants=args.participants, seed=args.seed)
    print(f"wrote a synthetic study to {args.out} ({args.layout} layout)")
    for name, study in truth["studies"].items():
        kept = study.get("expected_participants_kept")
        print(
            f"  {name} ({study['issue']}): {study['participants']} participants"
            + (f" ({kept} pass the capsule's inclusion rules)" if kept is not None else "")
            + f", Bayes-optimal accuracy {study['bayes_optimal_accuracy']:.3f}"
        )


def cmd_clean(args: argparse.Namespace) -> None:
    from grail.clean import clean

    report = clean(
        args.raw,
        args.out,
        validation_fraction=args.validation_fraction,
        seed=args.seed,
        opinion_tolerance=args.opinion_tolerance,
    )
    print(report_module.audit_markdown(report))
    print(f"wrote {args.out}/train.parquet, validation.parquet, audit.json, audit.md")


def cmd_audit(args: argparse.Namespace) -> None:
    report = audit_module.audit(args.path, json_out=args.json)
    print(report_module.audit_markdown(report))


def cmd_prompt(args: argparse.Namespace) -> None:
    from grail.contract import read_dataset
    from grail.prompts import to_example

    table = read_dataset(args.path, split=args.split)
    if not 0 <= args.row < table.num_rows:
        raise GrailError(f"--row {args.row} is out of range: {args.path} has {table.num_rows} rows")
    options = prompt_options(args)
    example = to_example(table.slice(args.row, 1).to_pylist()[0], options)
    for message in example["prompt"]:
        print(f"=== {message['role']} ===\n{message['content']}\n")
    print(f"=== gold ===\n{example['gold_index']} ({example['gold_id']})")


def cmd_tiny_model(args: argparse.Namespace) -> None:
    from grail.tiny import build_tiny_model

    out = build_tiny_model(
        args.out,
        data=args.data,
        task=args.task,
        hidden_size=args.hidden_size,
        layers=args.layers,
        vocab_size=args.vocab_size,
        seed=args.seed,
        format_warmup=args.format_warmup,
    )
    print(f"wrote a tiny {args.task} model and its tokenizer to {out}")


def cmd_benchmark(args: argparse.Namespace) -> None:
    from grail.benchmark import run

    result = run(
        args.data,
        args.out,
        models=args.model,
        split=args.split,
        limit=args.limit,
        references=args.reference,
        truth=args.truth,
        prompt=prompt_overrides(args),
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        concurrency=args.concurrency,
        backend=args.backend,
        dry_run_only=args.dry_run,
    )
    print((Path(args.out) / "report.md").read_text())
    print(
        f"wrote {args.out}/metrics.json, predictions.parquet, report.md, "
        + ", ".join(result["charts"])
    )


def cmd_generate(args: argparse.Namespace) -> None:
    from grail.generate import run

    options = prompt_options(args)
    summary = run(
        args.data,
        args.out,
        args.model,
        num_generations=args.num_generations,
        split=args.split,
        limit=args.limit,
        template=args.template,
        options=options,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        rewards=args.reward,
        batch_retries=args.batch_retries,
    )
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.out}/generated.parquet, sft.parquet, preferences.parquet, summary.json")


def cmd_export(args: argparse.Namespace) -> None:
    from grail.export import export
    from grail.launch import parse_params

    result = export(
        args.model,
        args.benchmark,
        args.dest,
        run_ids=parse_params(args.run_id),
        keep_stale=args.keep_stale,
    )
    print(
        f"exported to {args.dest}: {len(result['uploaded'])} uploaded, "
        f"{len(result['skipped'])} unchanged, {len(result['deleted'])} no longer exported deleted"
    )


def cmd_compile(args: argparse.Namespace) -> None:
    from grail.launch import compile_pipeline

    print(f"wrote {compile_pipeline(args.out)}")


def cmd_run(args: argparse.Namespace) -> None:
    from grail.launch import run_local

    if not args.local:
        raise GrailError(
            "only --local runs here; on a cluster use `grail submit` or "
            "`kfp run create -e EXPERIMENT -f pipelines/grail.yaml`"
        )
    where = run_local(
        recipe=args.recipe,
        participants=args.participants,
        destination=args.export_destination,
        algorithm=args.algorithm,
        max_steps=args.max_steps,
        outputs=args.outputs,
        benchmark_limit=args.benchmark_limit,
        runner=args.runner,
        image=args.image,
    )
    from grail.local_progress import closing_table

    lines = [f"\nlocal pipeline run finished in {where['seconds']} s\n"]
    lines.append(closing_table(where["issues"]) + "\n")
    for row in where["issues"]:
        pad = " " * len(row["issue"])
        lines.append(f"{row['issue']}: report {row['report']}")
        lines += [f"{pad}  chart  {chart}" for chart in row["charts"]]
        if row["issue"] in where["models"]:
            lines.append(f"{pad}  model  {where['models'][row['issue']]}")
    lines += [f"export: {where['export']}", f"log: {where['log']}", where["mlflow"]]
    # not print(): kfp.local may leave print() patched to indent (logging_utils.indented_print)
    sys.stdout.write("\n".join(lines) + "\n")


def cmd_submit(args: argparse.Namespace) -> None:
    from grail.launch import read_secret_file, submit

    run_id = submit(
        args.package,
        args.host,
        args.experiment,
        args.param,
        args.run_name,
        namespace=args.namespace,
        pipeline_root=args.pipeline_root,
        service_account=args.service_account,
        token=read_secret_file(args.token_file, "KF_PIPELINES_TOKEN"),
        cookie=read_secret_file(args.cookie_file, "KF_PIPELINES_COOKIE"),
    )
    where = f" (namespace {args.namespace})" if args.namespace else ""
    print(f"created run {run_id} in experiment {args.experiment} on {args.host}{where}")


def cmd_doctor(args: argparse.Namespace) -> None:
    from grail.doctor import doctor

    checks = doctor(args.namespace, args.kfp_host, args.mlflow_uri, mode=args.mode)
    for check in checks:
        print(check.line())
    missing = [c.name for c in checks if not c.ok]
    if missing:
        raise GrailError(f"{len(missing)} of {len(checks)} checks failed: {', '.join(missing)}")
    print(f"all {len(checks)} checks passed")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grail", description=__doc__.split("\n\n")[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True)

    sim = commands.add_parser("simulate", help="write a synthetic study in the raw export format")
    sim.add_argument("--out", required=True, help="folder to write the raw export into")
    sim.add_argument(
        "--participants",
        type=int,
        default=None,
        help="participants over the three studies (default: as the real study, 6044)",
    )
    sim.add_argument("--seed", type=int, default=7, help="random seed (same seed, same bytes)")
    sim.add_argument(
        "--layout",
        choices=["grail", "capsule"],
        default="grail",
        help="grail's own raw layout, or the published CodeOcean capsule's (folders, file names, "
        "survey columns and inclusion rules)",
    )
    sim.set_defaults(func=cmd_simulate)

    cln = commands.add_parser("clean", help="raw export -> step rows, split by participant, audit")
    cln.add_argument("--raw", required=True, help="raw export folder (real or simulated)")
    cln.add_argument("--out", required=True, help="output folder for the parquet files and audit")
    cln.add_argument(
        "--validation-fraction",
        type=fraction,
        default=0.1,
        help="share of participants in the validation split",
    )
    cln.add_argument("--seed", type=int, default=2024, help="seed of the participant split")
    cln.add_argument(
        "--opinion-tolerance",
        type=fraction,
        default=0.05,
        help="opinion changes within this are labelled no_change",
    )
    cln.set_defaults(func=cmd_clean)

    aud = commands.add_parser(
        "audit",
        help="position baselines and leakage detectors",
        description=audit_module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    aud.add_argument("path", help="cleaned folder or one parquet file in the contract")
    aud.add_argument("--json", default=None, help="also write the report as JSON here")
    aud.set_defaults(func=cmd_audit)

    prm = commands.add_parser("prompt", help="print the prompt of one row")
    prm.add_argument("path", help="cleaned folder or one parquet file in the contract")
    prm.add_argument("--row", type=int, default=0, help="row number (0-based)")
    prm.add_argument(
        "--split", default=None, choices=["train", "validation"], help="index rows within one split"
    )
    add_prompt_arguments(prm)
    prm.set_defaults(func=cmd_prompt)

    tiny = commands.add_parser("tiny-model", help="build a tiny Qwen2 model + tokenizer offline")
    tiny.add_argument("--out", required=True, help="folder to write the model into")
    tiny.add_argument(
        "--data",
        default=None,
        help="cleaned dataset whose prompts train the tokenizer (default: simulate)",
    )
    tiny.add_argument(
        "--task",
        default="causal-lm",
        choices=["causal-lm", "classifier"],
        help="causal-lm (the policy) or classifier (the GRAIL discriminator)",
    )
    tiny.add_argument("--hidden-size", type=int, default=64, help="hidden size")
    tiny.add_argument("--layers", type=int, default=2, help="transformer layers")
    tiny.add_argument("--vocab-size", type=int, default=2048, help="BPE vocabulary size at most")
    tiny.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    tiny.add_argument(
        "--format-warmup",
        type=int,
        default=0,
        help="teacher-force the answer format for N steps (answers at chance), so "
        "GRPO rewards vary on a tiny model; 0 keeps random weights",
    )
    tiny.set_defaults(func=cmd_tiny_model)

    bench = commands.add_parser("benchmark", help="baselines and models on a split: report, charts")
    bench.add_argument("--data", required=True, help="cleaned folder or parquet file")
    bench.add_argument("--out", required=True, help="output folder")
    bench.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="SPEC",
        help="model folder, training output, checkpoint URI (s3://, file://), "
        "openai:NAME@URL or openai:NAME; repeatable",
    )
    bench.add_argument("--split", default="validation", help="split to evaluate")
    bench.add_argument("--limit", type=positive_int, default=None, help="evaluate the first N rows")
    bench.add_argument(
        "--reference",
        action="append",
        default=None,
        metavar="NAME",
        help="systems to compute win rates against (default: all)",
    )
    bench.add_argument(
        "--truth", default=None, help="truth_steps.csv for the ceiling (default: next to the data)"
    )
    add_prompt_arguments(bench, as_trained=True)
    bench.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="tokens per answer (default: the model's max_completion_length, else 128)",
    )
    bench.add_argument("--batch-size", type=int, default=16, help="local generation batch size")
    bench.add_argument(
        "--backend",
        choices=["auto", "transformers", "vllm"],
        default="auto",
        help="local models: vLLM where a GPU and vllm are present (auto), else transformers",
    )
    bench.add_argument("--concurrency", type=int, default=8, help="parallel API requests")
    bench.add_argument(
        "--dry-run", action="store_true", help="print what API models would be sent; send nothing"
    )
    bench.set_defaults(func=cmd_benchmark)

    gen = commands.add_parser("generate", help="completions from a model server (distilabel)")
    gen.add_argument("--data", required=True, help="cleaned folder or parquet file")
    gen.add_argument("--out", required=True, help="output folder")
    gen.add_argument(
        "--model",
        required=True,
        help="openai:NAME@URL (vllm serve, transformers serve) or openai:NAME",
    )
    gen.add_argument("--num-generations", type=int, default=4, help="completions per prompt")
    gen.add_argument("--split", default="train", help="split to generate for")
    gen.add_argument("--limit", type=positive_int, default=None, help="the first N rows only")
    gen.add_argument(
        "--template",
        default=None,
        help="Jinja template file replacing the user prompt (sees `row`)",
    )
    gen.add_argument("--temperature", type=float, default=0.8, help="sampling temperature")
    gen.add_argument("--max-new-tokens", type=int, default=256, help="tokens per completion")
    gen.add_argument("--batch-size", type=int, default=16, help="requests per distilabel batch")
    gen.add_argument(
        "--batch-retries",
        type=int,
        default=2,
        help="retries of failed batches, one request at a time",
    )
    gen.add_argument(
        "--reward",
        action="append",
        default=None,
        help="reward functions to score with (default: accuracy, format)",
    )
    add_prompt_arguments(gen)
    gen.set_defaults(func=cmd_generate)

    exp = commands.add_parser("export", help="model + benchmark + manifest to S3 or a folder")
    exp.add_argument("--model", required=True, help="final model folder")
    exp.add_argument("--benchmark", default=None, help="benchmark output folder")
    exp.add_argument("--dest", required=True, help="s3://bucket/prefix, file://path or a path")
    exp.add_argument(
        "--keep-stale",
        action="store_true",
        help="keep objects at the destination that this export no longer contains",
    )
    exp.add_argument(
        "--run-id",
        action="append",
        default=[],
        metavar="KEY=ID",
        help="source run ids recorded in the manifest",
    )
    exp.set_defaults(func=cmd_export)

    cmp = commands.add_parser("compile", help="compile the KFP pipeline to pipelines/grail.yaml")
    cmp.add_argument("--out", default=None, help="output path (default pipelines/grail.yaml)")
    cmp.set_defaults(func=cmd_compile)

    run = commands.add_parser("run", help="run the whole pipeline locally with kfp.local")
    run.add_argument("--local", action="store_true", help="run on this machine (kfp.local)")
    run.add_argument(
        "--recipe",
        default="recipes/tiny/config_{algorithm}.yaml",
        help="training recipe ({algorithm} and {issue} are filled in)",
    )
    run.add_argument("--algorithm", default="grail", choices=["grpo", "grail"])
    run.add_argument("--participants", type=int, default=1500, help="size of the synthetic study")
    run.add_argument("--max-steps", type=int, default=10, help="training steps per issue")
    run.add_argument(
        "--benchmark-limit", type=int, default=100, help="validation rows benchmarked per issue"
    )
    run.add_argument(
        "--outputs",
        default="local_outputs",
        help="folder for the pipeline root, the MLflow store and the export",
    )
    run.add_argument(
        "--export-destination",
        default=None,
        help="s3://bucket/prefix (default: OUTPUTS/export)",
    )
    run.add_argument(
        "--runner",
        choices=["subprocess", "docker"],
        default="subprocess",
        help="kfp.local runner: this Python environment, or containers through DOCKER_HOST",
    )
    run.add_argument(
        "--image",
        default="localhost/grail:dev",
        help="with --runner docker: the image every task runs in (make images-local)",
    )
    run.set_defaults(func=cmd_run)

    sub = commands.add_parser("submit", help="create a run on a Kubeflow Pipelines cluster")
    sub.add_argument(
        "package",
        nargs="?",
        default="pipelines/grail.yaml",
        help="compiled pipeline (default pipelines/grail.yaml)",
    )
    sub.add_argument("--host", required=True, help="KFP API endpoint URL")
    sub.add_argument("--experiment", required=True, help="KFP experiment name")
    sub.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="pipeline parameter (JSON values: numbers, lists, true/false)",
    )
    sub.add_argument("--run-name", default=None, help="run name (default: grail-<time>)")
    sub.add_argument(
        "--namespace",
        default=None,
        help="multi-user KFP: the Profile namespace the run (and its experiment) belongs to",
    )
    sub.add_argument(
        "--pipeline-root",
        default=None,
        help="artifact root for this run (default: the namespace's kfp-launcher ConfigMap)",
    )
    sub.add_argument(
        "--service-account",
        default=None,
        help="service account the run's pods use (default: pipeline-runner / default-editor)",
    )
    sub.add_argument(
        "--token-file",
        default=None,
        help="file holding a bearer token (default: $KF_PIPELINES_TOKEN)",
    )
    sub.add_argument(
        "--cookie-file",
        default=None,
        help="file holding a session cookie, e.g. authservice_session=... "
        "(default: $KF_PIPELINES_COOKIE)",
    )
    sub.set_defaults(func=cmd_submit)

    doc = commands.add_parser("doctor", help="check a cluster has what a run needs")
    doc.add_argument(
        "--mode",
        choices=["standalone", "multi-user"],
        default="standalone",
        help="KFP install mode (README: Run on Kubeflow)",
    )
    doc.add_argument(
        "--namespace",
        default=None,
        help="where KFP runs the pipeline's pods (default: kubeflow; multi-user: the Profile's)",
    )
    doc.add_argument("--kfp-host", default=None, help="KFP API URL (default: $KFP_HOST)")
    doc.add_argument(
        "--mlflow-uri", default=None, help="MLflow server URL (default: $MLFLOW_TRACKING_URI)"
    )
    doc.set_defaults(func=cmd_doctor)

    commands.add_parser(
        "train",
        add_help=False,
        help="GRPO / GRAIL training: grail train --config RECIPE [--key value ...]",
    )
    return parser


_MAIN_PID = os.getpid()


def _stop(signum, frame):
    """SIGTERM (a pod being stopped, a kill) unwinds like an error, so half-written outputs are
    removed and the previous ones stay. Forked workers (distilabel's, multiprocessing's) inherit
    the handler: they die as they always did, or their pool could never be terminated."""
    if os.getpid() != _MAIN_PID:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    global _MAIN_PID
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    _MAIN_PID = os.getpid()
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return _main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    head = argv[: argv.index("train")] if "train" in argv else None
    if head is not None and set(head) <= {"--debug"}:
        from grail.train import main as train_main  # owns its parser (the recipe fields)

        return _guarded(lambda: train_main(argv[len(head) + 1 :]), bool(head))
    args = build_parser().parse_args(argv)
    show_progress()
    return _guarded(lambda: args.func(args), args.debug)


def _guarded(action, debug: bool) -> int:
    try:
        action()
    except GrailError as err:
        if debug:
            raise
        print(f"grail: error: {mask_secrets(str(err))}", file=sys.stderr)
        return 2
    except (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError) as err:
        if debug:  # a path the user gave that is missing or of the wrong kind
            raise
        where = f"{err.filename}: " if err.filename else ""
        print(f"grail: error: {mask_secrets(where + (err.strerror or str(err)))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
