"""Benchmark the benchmark stage: seconds per baseline over the validation split of the default
synthetic study (about 2.2k rows, fit on about 19.6k train rows), and rows/s of tiny-model
evaluation on CPU (in-process, greedy, batched).

Run: ``.venv/bin/python bench/benchmark.py [--model-rows 256]``. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from grail.clean.stage import clean
from grail.inference.local import answer_local
from grail.tasks.slate.baselines import BASELINES
from grail.tasks.slate.contract import read_dataset
from grail.tasks.slate.metrics import accuracy
from grail.tasks.slate.prompts import PromptOptions, to_example
from grail.tasks.slate.simulate import simulate
from grail.tasks.slate.warmup import STEPS as TINY_WARMUP
from grail.train.tiny import build_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-rows", type=int, default=256, help="rows for the tiny model")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="grail-bench-benchmark-") as tmp:
        simulate(Path(tmp) / "raw", seed=7)
        clean(Path(tmp) / "raw", Path(tmp) / "clean")
        train = read_dataset(Path(tmp) / "clean", split="train").to_pylist()
        rows = read_dataset(Path(tmp) / "clean", split="validation").to_pylist()
        gold = [r["gold_index"] for r in rows]
        print(f"{len(train)} train rows, {len(rows)} validation rows\n")
        print("| baseline | seconds | accuracy |")
        print("|---|---:|---:|")
        total = 0.0
        for name, baseline in BASELINES.items():
            start = time.perf_counter()
            predictions = baseline(train, rows).predictions
            seconds = time.perf_counter() - start
            total += seconds
            print(f"| {name} | {seconds:.2f} | {accuracy(predictions, gold)['accuracy']:.3f} |")
        print(f"| **all baselines** | **{total:.2f}** | |\n")

        model = build_tiny_model(
            Path(tmp) / "tiny", data=Path(tmp) / "clean", format_warmup=TINY_WARMUP
        )
        subset = rows[: args.model_rows]
        conversations = [to_example(r, PromptOptions())["prompt"] for r in subset]
        print(
            "| tiny model (CPU, greedy + choice distribution) | batch | rows | seconds | rows/s |"
        )
        print("|---|---:|---:|---:|---:|")
        for batch_size in (1, 16, 64):
            start = time.perf_counter()
            options = [r["n_options"] for r in subset]
            answer_local(
                str(model), conversations, options, args.max_new_tokens, batch_size, "auto"
            )
            seconds = time.perf_counter() - start
            print(
                f"| {args.max_new_tokens} new tokens | {batch_size} | {len(subset)} | "
                f"{seconds:.1f} | {len(subset) / seconds:.1f} |"
            )


if __name__ == "__main__":
    main()
