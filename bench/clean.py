"""Benchmark the clean stage: seconds and rows/s on the default synthetic study and one 4x larger.

Run: ``.venv/bin/python bench/clean.py [--repeats 3] [--sizes 1 4]``. Prints a Markdown table; the
best of the repeats is reported (the machine's other load only ever adds time).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from grail.clean.stage import clean
from grail.tasks.slate.simulate import simulate
from grail.tasks.slate.world import STUDIES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--sizes",
        type=float,
        nargs="+",
        default=[1, 4],
        help="study sizes as multiples of the default (6044 participants)",
    )
    args = parser.parse_args()
    default = sum(s.participants for s in STUDIES)
    print("| study | participants | rows in | rows kept | simulate s | clean s (best) | rows/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="grail-bench-") as tmp:
        for size in args.sizes:
            participants = round(default * size)
            raw = Path(tmp) / f"raw{size}"
            start = time.perf_counter()
            simulate(raw, participants=participants, seed=7)
            simulate_seconds = time.perf_counter() - start
            timings = []
            for k in range(args.repeats):
                start = time.perf_counter()
                report = clean(raw, Path(tmp) / f"clean{size}_{k}")
                timings.append(time.perf_counter() - start)
            acc = report["accounting"]
            best = min(timings)
            label = "default" if size == 1 else f"{size:g}x default"
            print(
                f"| {label} | {participants} | {acc['rows_in']} | {acc['rows_kept']} | "
                f"{simulate_seconds:.1f} | {best:.2f} | {acc['rows_in'] / best:,.0f} |"
            )


if __name__ == "__main__":
    main()
