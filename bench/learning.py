"""A CPU learning curve: tiny GRPO and tiny GRAIL on the default synthetic study.

Validation accuracy and log-loss of the chosen video (95% participant-bootstrap intervals) of
the model at step 0 and every K steps, beside always-first, the ranker, the oracle and the
Bayes-optimal expectation (for log-loss: the choice model's exact expected log-loss), printed
as a Markdown table and drawn as ``learning_curve.svg`` (accuracy) and
``log_loss_curve.svg``. Each model is asked the way it was trained.

Run: ``.venv/bin/python bench/learning.py [--steps 300] [--every 50] [--rows 600]
[--out learning_outputs]`` (about 10 minutes on 2 cores with the defaults).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from grail.benchmark.stage import run as benchmark
from grail.clean.stage import clean
from grail.tasks.slate.baselines import EXPECTED_CEILING, ORACLE
from grail.tasks.slate.simulate import simulate
from grail.tasks.slate.warmup import STEPS as TINY_WARMUP
from grail.train.config import parse_train_args
from grail.train.stage import run as train
from grail.train.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ("always_first", "ranker", ORACLE, EXPECTED_CEILING)


def train_run(algorithm: str, data: Path, policy: Path, disc: Path, out: Path, args) -> float:
    started = time.perf_counter()
    argv = ["--config", str(ROOT / "recipes" / "tiny" / f"config_{algorithm}.yaml")]
    argv += ["--dataset", str(data), "--model_name_or_path", str(policy)]
    argv += ["--output_dir", str(out), "--max_steps", str(args.steps)]
    argv += ["--save_steps", str(args.every), "--save_total_limit", str(args.steps // args.every)]
    argv += ["--max_train_rows", "100000", "--report_to", "none", "--disable_tqdm", "true"]
    if algorithm == "grail":
        argv += ["--gail_model", str(disc)]
    train(*parse_train_args(argv))
    return time.perf_counter() - started


def curve(result: dict, label: str) -> list[tuple[int, dict]]:
    """A training run's points, step 0 (its starting model) first."""
    points = [(s["step"], s) for s in result["systems"].values() if s.get("series") == label]
    return sorted(points, key=lambda point: point[0])


def interval(entry: dict, metric: str) -> tuple[float, float]:
    if metric == "accuracy":
        return entry["ci_low"], entry["ci_high"]
    return tuple(entry[f"{metric}_ci"])


def cell(entry: dict, metric: str) -> str:
    if entry.get(metric) is None:
        return "–"
    if entry.get(f"{metric}_ci") is None and metric != "accuracy":
        return f"{entry[metric]:.3f}"
    low, high = interval(entry, metric)
    return f"{entry[metric]:.3f} [{low:.3f}, {high:.3f}]"


def table(curves: dict, references: dict) -> None:
    print("| run | step | accuracy [95% CI] | log-loss [95% CI] | parse rate |")
    print("|---|---:|---|---|---:|")
    for label, points in curves.items():
        for step, s in points:
            print(
                f"| {label} | {step} | {cell(s, 'accuracy')} | {cell(s, 'log_loss')} | "
                f"{s['parse_rate']:.2f} |"
            )
    print("\n| reference | accuracy [95% CI] | log-loss [95% CI] |\n|---|---|---|")
    for name, s in references.items():
        print(f"| {name} | {cell(s, 'accuracy')} | {cell(s, 'log_loss')} |")


def chart(curves: dict, references: dict, metric: str, path: Path) -> None:
    from grail.core.charts import pyplot, save_svg
    from grail.tasks.slate.benchmark.report import REFERENCE_STYLES

    fig, ax = pyplot().subplots(figsize=(8, 5))
    for label, points in curves.items():
        entries = [s for _, s in points if s.get(metric) is not None]
        values = [e[metric] for e in entries]
        low, high = zip(*(interval(e, metric) for e in entries), strict=True)
        ax.errorbar(
            [e["step"] for e in entries],
            values,
            yerr=[
                [v - lo for v, lo in zip(values, low, strict=True)],
                [h - v for v, h in zip(values, high, strict=True)],
            ],
            marker="o",
            capsize=3,
            label=label,
        )
    for name, s in references.items():
        if s.get(metric) is not None:
            style = {"linewidth": 1, "linestyle": "--"} | REFERENCE_STYLES.get(name, {})
            ax.axhline(s[metric], label=name, **style)
    ax.set_xlabel("training step (0: the starting model)")
    what = "validation accuracy" if metric == "accuracy" else "log-loss of the chosen video"
    ax.set_ylabel(f"{what} (95% participant-bootstrap interval)")
    ax.set_title(f"Tiny GRPO and GRAIL on the default synthetic study (CPU): {what}")
    ax.legend(loc="best", fontsize=8)
    save_svg(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--rows", type=int, default=600, help="validation rows evaluated")
    parser.add_argument("--out", default="learning_outputs")
    args = parser.parse_args()
    out = Path(args.out).absolute()
    started = time.perf_counter()
    simulate(out / "raw", seed=2024)
    clean(out / "raw", out / "clean")
    policy = build_tiny_model(out / "policy", data=out / "clean", format_warmup=TINY_WARMUP)
    disc = build_tiny_model(out / "disc", data=out / "clean", task="classifier")
    seconds = {
        algorithm: train_run(algorithm, out / "clean", policy, disc, out / algorithm, args)
        for algorithm in ("grpo", "grail")
    }
    result = benchmark(
        out / "clean",
        out / "benchmark",
        models=[str(out / "grpo"), str(out / "grail")],
        limit=args.rows,
        prompt=json.loads((out / "grpo" / "prompt.json").read_text()),
    )
    systems = result["systems"]
    curves = {label: curve(result, label) for label in ("grpo", "grail")}
    references = {name: systems[name] for name in REFERENCES if name in systems}
    table(curves, references)
    chart(curves, references, "accuracy", out / "learning_curve.svg")
    chart(curves, references, "log_loss", out / "log_loss_curve.svg")
    print(
        f"\n{args.rows} validation rows; training {seconds['grpo']:.0f} s (GRPO) and "
        f"{seconds['grail']:.0f} s (GRAIL) for {args.steps} steps; "
        f"{time.perf_counter() - started:.0f} s in all; charts: {out / 'learning_curve.svg'}, "
        f"{out / 'log_loss_curve.svg'}"
    )


if __name__ == "__main__":
    main()
