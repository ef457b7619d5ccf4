"""Does the tiny summarizer learn? The summarize demo's training over several seeds.

For each seed: the demo's tiny summarizer (its format warm-up, ``--seed`` for its weights),
GRPO with ``recipes/tiny/config_summarize.yaml`` (``--seed`` for the samples), then the benchmark
of step 0 and the final model on the validation documents. Prints, per seed, step 0, the final
model, the change with its 95% document-bootstrap interval (paired by document), and the
baselines every seed shares: random-k, lead-k, TF-IDF, and the position-only ceiling (the best
a summarizer that sees positions but not words can do). The study is the demo's: 300 synthetic
documents, 91 for validation.

Run: ``.venv/bin/python bench/summarize_seeds.py [--seeds 10] [--out summarize_seeds]
[--learning_rate 2e-3 ...]`` (further options override the recipe; about 2 minutes a seed on
2 cores).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from grail.clean.config import CleanConfig
from grail.tasks.summarize.benchmark import benchmark_documents
from grail.tasks.summarize.clean import clean_documents
from grail.tasks.summarize.documents import DEFAULT_DOCUMENTS, simulate_documents
from grail.tasks.summarize.warmup import STEPS as WARMUP
from grail.train.config import parse_train_args
from grail.train.stage import run as train
from grail.train.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "tiny" / "config_summarize.yaml"
SHARED = ("random_k", "lead_k", "tfidf_centrality")


def one_seed(seed: int, data: Path, out: Path, steps: int | None, extra: list[str]) -> dict:
    started = time.perf_counter()
    policy = build_tiny_model(out / "policy", data=str(data), format_warmup=WARMUP, seed=seed)
    argv = ["--config", str(RECIPE), "--dataset", str(data)]
    argv += ["--model_name_or_path", str(policy), "--output_dir", str(out / "run")]
    argv += ["--seed", str(seed), "--disable_tqdm", "true", *extra]
    if steps:
        argv += ["--max_steps", str(steps), "--save_steps", str(steps)]
    train(*parse_train_args(argv))
    result = benchmark_documents(
        data, out / "benchmark", models=[str(out / "run")], start_model=str(policy)
    )
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def row(seed: int, result: dict) -> dict:
    systems = result["systems"]
    (change,) = result["differences"].values()
    steps = sorted(
        (entry.get("step") or 0, name)
        for name, entry in systems.items()
        if entry.get("kind") == "model"
    )
    start, final = systems[steps[0][1]]["answered"], systems[steps[-1][1]]["answered"]
    return {
        "seed": seed,
        "step 0": start["mean"],
        "final": final["mean"],
        "change": change["difference"],
        "ci": tuple(change["ci"]),
        "seconds": result["seconds"],
        **{name: systems[name]["answered"]["mean"] for name in SHARED if name in systems},
        "position_only": (result.get("position_only") or {}).get("mean"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--out", default="summarize_seeds")
    args, extra = parser.parse_known_args()  # the rest: recipe overrides (--learning_rate 2e-3)
    out = Path(args.out)
    # the demo's study: CleanConfig's seed simulates it, Summary-RL's split (91, seed 80)
    simulate_documents(out / "raw", documents=DEFAULT_DOCUMENTS, seed=CleanConfig.seed)
    clean_documents(out / "raw", out / "documents")
    data = out / "documents"
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        rows.append(row(seed, one_seed(seed, data, out / f"seed-{seed}", args.steps, extra)))
        print(json.dumps(rows[-1]), flush=True)
    print()
    print("| seed | step 0 | final | change [95% CI] | s |")
    print("|---:|---:|---:|---|---:|")
    for r in rows:
        low, high = r["ci"]
        print(
            f"| {r['seed']} | {r['step 0']:.3f} | {r['final']:.3f} | "
            f"{r['change']:+.3f} [{low:+.3f}, {high:+.3f}] | {r['seconds']:.0f} |"
        )
    above = sum(r["ci"][0] > 0 for r in rows)
    beat_random = sum(r["final"] > r.get("random_k", 1.0) for r in rows)
    print(
        f"\ninterval above zero: {above} of {len(rows)} seeds; final above random_k: "
        f"{beat_random} of {len(rows)}"
    )
    shared = (*SHARED, "position_only")
    print(" ".join(f"{name} {rows[0][name]:.3f}" for name in shared if rows[0].get(name)))


if __name__ == "__main__":
    main()
