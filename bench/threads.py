"""Benchmark how the embedded default's training uses two cores: one training step of the tiny
policy (the demo's shape: 64 rows of 480 tokens, the LM head at the last 8 positions, AdamW)
with 1 and 2 torch threads in one process, and in two 1-thread processes at once.

Why: the tiny-models task clones and warms up the tiny policy alone on the machine, with every
core as threads (``components/train/task.py``); the branches after it run side by side, one
thread each. Whether a second thread buys what a second process does decides where the
demo's cores go (docs/development.md#the-demo).

Run: ``.venv/bin/python bench/threads.py [--steps 5]``. Prints a Markdown table; each figure
is the median step after one warm-up step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS, TOKENS, KEPT = 64, 480, 8  # the demo's cloning batch: 64 rows of about 480 tokens


def steps(model_path: str, threads: int, count: int) -> list[float]:
    """Seconds of each of `count` training steps after a warm-up one, on `threads` threads."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(3, model.config.vocab_size, (ROWS, TOKENS))
    seconds = []
    for _ in range(count + 1):
        started = time.perf_counter()
        logits = model(input_ids=ids, logits_to_keep=KEPT).logits
        logits.float().logsumexp(-1).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        seconds.append(time.perf_counter() - started)
    return seconds[1:]


def child(model_path: str, threads: int, count: int) -> subprocess.Popen:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from threads import steps; "
        "print(json.dumps(steps(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))"
    )
    command = [sys.executable, "-c", code, str(Path(__file__).parent), model_path]
    return subprocess.Popen([*command, str(threads), str(count)], stdout=subprocess.PIPE, text=True)


def median_of(process: subprocess.Popen) -> float:
    out, _ = process.communicate()
    if process.returncode:
        raise SystemExit(f"a timing process failed with status {process.returncode}")
    return statistics.median(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    from grail.clean.stage import clean
    from grail.tasks.slate.simulate import simulate
    from grail.train.tiny import build_tiny_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per setting")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="grail-bench-threads-") as tmp:
        simulate(Path(tmp) / "raw", participants=240, seed=11)
        clean(Path(tmp) / "raw", Path(tmp) / "clean")
        model = str(build_tiny_model(Path(tmp) / "policy", data=Path(tmp) / "clean"))
        one = median_of(child(model, 1, args.steps))
        two = median_of(child(model, 2, args.steps))
        pair = [child(model, 1, args.steps) for _ in range(2)]
        side = [median_of(p) for p in pair]
    print(f"tiny policy, {ROWS} rows x {TOKENS} tokens per step, median of {args.steps} steps\n")
    print("| setting | seconds per step | rows per second | against 1 thread |")
    print("|---|---:|---:|---:|")
    print(f"| 1 process, 1 thread | {one:.3f} | {ROWS / one:.1f} | 1.00 |")
    print(f"| 1 process, 2 threads | {two:.3f} | {ROWS / two:.1f} | {one / two:.2f} |")
    both = sum(ROWS / s for s in side)
    slowest = max(side)
    print(
        f"| 2 processes at once, 1 thread each | {slowest:.3f} (the slower) | {both:.1f} "
        f"(both) | {both / (ROWS / one):.2f} |"
    )


if __name__ == "__main__":
    main()
