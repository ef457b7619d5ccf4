"""`make bench` runs scripts that exist (it named bench/evaluate.py for weeks after #41 renamed
it bench/predict.py), and bench/threads.py times real training steps."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_script_make_bench_runs_exists():
    recipe = re.search(r"^bench: .*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    scripts = []
    for line in recipe.group(1).splitlines():
        folder = "bench" if line.strip().startswith("cd bench") else "."
        scripts += [Path(folder) / name for name in re.findall(r"(\S+\.py)\b", line)]
    assert len(scripts) >= 5, scripts
    missing = [str(s) for s in scripts if not (ROOT / s).is_file()]
    assert not missing, missing


def test_the_threads_bench_times_training_steps_of_the_tiny_policy(tiny_policy):
    from bench_scripts import load

    seconds = load("threads").steps(str(tiny_policy), 1, 2)
    assert len(seconds) == 2 and all(0 < s < 60 for s in seconds), seconds
