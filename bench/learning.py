"""A CPU learning curve: tiny GRPO and tiny GRAIL on the default synthetic study.

Validation accuracy (95% Wilson intervals) of the model at step 0 and every K steps, beside
always-first, the ranker, the oracle and the Bayes-optimal expectation, printed as a Markdown
table and drawn as ``learning_curve.svg``. Each model is asked the way it was trained.

Run: ``.venv/bin/python bench/learning.py [--steps 300] [--every 50] [--rows 600]
[--out learning_outputs]`` (about 10 minutes on 2 cores with the defaults).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from grail.benchmark import EXPECTED_CEILING, ORACLE
from grail.benchmark import run as benchmark
from grail.clean import clean
from grail.simulate import simulate
from grail.tiny import build_tiny_model
from grail.train import run as train
from grail.train_config import parse_train_args

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
    points = [(s["step"], s) for s in result["systems"].values() if s.get("series") == label]
    return sorted(points, key=lambda point: point[0])


def table(curves: dict, start: dict, references: dict) -> None:
    print("| run | step | accuracy [95% CI] | parse rate |")
    print("|---|---:|---|---:|")
    for label, points in curves.items():
        for step, s in [(0, start), *points]:
            print(
                f"| {label} | {step} | {s['accuracy']:.3f} [{s['ci_low']:.3f}, "
                f"{s['ci_high']:.3f}] | {s['parse_rate']:.2f} |"
            )
    print("\n| reference | accuracy [95% CI] |\n|---|---|")
    for name, s in references.items():
        print(f"| {name} | {s['accuracy']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}] |")


def chart(curves: dict, start: dict, references: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for label, points in curves.items():
        steps = [0, *[step for step, _ in points]]
        entries = [start, *[s for _, s in points]]
        ax.errorbar(
            steps,
            [e["accuracy"] for e in entries],
            yerr=[
                [e["accuracy"] - e["ci_low"] for e in entries],
                [e["ci_high"] - e["accuracy"] for e in entries],
            ],
            marker="o",
            capsize=3,
            label=label,
        )
    for name, s in references.items():
        ax.axhline(s["accuracy"], linestyle="--", linewidth=1, label=name)
    ax.set_xlabel("training step")
    ax.set_ylabel("validation accuracy (95% Wilson interval)")
    ax.set_ylim(0, 1)
    ax.set_title("Tiny GRPO and GRAIL on the default synthetic study (CPU)")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


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
    policy = build_tiny_model(out / "policy", data=out / "clean", format_warmup=100)
    disc = build_tiny_model(out / "disc", data=out / "clean", task="classifier")
    seconds = {
        algorithm: train_run(algorithm, out / "clean", policy, disc, out / algorithm, args)
        for algorithm in ("grpo", "grail")
    }
    result = benchmark(
        out / "clean",
        out / "benchmark",
        models=[str(policy), str(out / "grpo"), str(out / "grail")],
        limit=args.rows,
        prompt=json.loads((out / "grpo" / "prompt.json").read_text()),
    )
    systems = result["systems"]
    start = systems[policy.name]
    curves = {label: curve(result, label) for label in ("grpo", "grail")}
    references = {name: systems[name] for name in REFERENCES if name in systems}
    table(curves, start, references)
    chart(curves, start, references, out / "learning_curve.svg")
    print(
        f"\n{args.rows} validation rows; training {seconds['grpo']:.0f} s (GRPO) and "
        f"{seconds['grail']:.0f} s (GRAIL) for {args.steps} steps; "
        f"{time.perf_counter() - started:.0f} s in all; chart: {out / 'learning_curve.svg'}"
    )


if __name__ == "__main__":
    main()
