"""The embedded policy can learn to read. On the ladder's first rung (``grail simulate --choices
marker``: the option whose title opens with a marker word is chosen with probability 0.9
wherever it stands), the tiny policy built as the tiny-models task builds it, its format
warm-up reading the prompts as a language model (``--warmup-prompt-weight 1``), and cloned
by ``recipes/tiny/config_bc.yaml`` with enough updates beats the position prior by a clear
margin and reads the options. A change that stops the prompt reaching the answer (a
truncated prompt, the loss on the wrong token, a mask, a warm-up that no longer reads the
prompt) fails here.

The integration tier: the warm-up and 204 cloning steps of batch 16 at lr 4e-3 (the fastest
cloning measured to read: docs/results.md#the-learnability-ladder) take the test 61 s on 2
cores, and `make test` would take 232 s with it against 171 s without (its budget: 3 min).
Measured on this study: 67%, 4% and 54% of always-first's gap to the ceiling closed (cloning
seeds 42, 43, 44; the test runs 42), the options swap +1.6, +0.18 and +1.0 nats; with lr
2e-3, 306 steps read in 4 runs of 4 (about 25 s more); without the prompt in the warm-up,
nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grail.benchmark.stage import run as benchmark
from grail.clean.stage import clean
from grail.tasks.slate.contract import issue_subset
from grail.tasks.slate.simulate import simulate
from grail.tasks.slate.warmup import STEPS
from grail.train.config import parse_train_args
from grail.train.sft import sft_warm_start
from grail.train.tiny import build_tiny_model

pytestmark = pytest.mark.integration  # 61 s of training and scoring

ROOT = Path(__file__).resolve().parents[1]
# enough updates for the pointer to form (the demo's 39 steps are before it does)
READS = {
    "sft_batch_size": "16",
    "sft_learning_rate": "4.0e-3",
    "sft_num_train_epochs": "4",
    "sft_early_stopping_patience": "3",
}


def test_the_tiny_policy_learns_the_marker_rung_and_reads_the_options(tmp_path):
    simulate(tmp_path / "raw", participants=1500, seed=7, choices="marker")
    clean(tmp_path / "raw", tmp_path / "all", validation_fraction=0.4)
    data = tmp_path / "gun"
    issue_subset(tmp_path / "all", "gun_control", data)
    policy = build_tiny_model(
        tmp_path / "policy", data=data, format_warmup=STEPS, warmup_prompt_weight=1.0
    )
    argv = ["--config", str(ROOT / "recipes" / "tiny" / "config_bc.yaml"), "--dataset", str(data)]
    argv += ["--model_name_or_path", str(policy), "--output_dir", str(tmp_path / "bc")]
    argv += [part for key, value in READS.items() for part in (f"--{key}", value)]
    model = Path(sft_warm_start(*parse_train_args(argv + ["--disable_tqdm", "true"])))
    prompt = json.loads((model / "prompt.json").read_text())
    result = benchmark(
        data, tmp_path / "bench", models=[str(model)], limit=300, prompt=prompt, reads_rows=150
    )
    cloned, prior = result["systems"][model.name], result["systems"]["always_first"]
    # seeds 42 / 43 / 44 of this cloning: 0.717 / 1.298 / 0.839 against 1.342, the options
    # swap's interval from +1.337 / +0.075 / +0.804; without the warm-up's reading, 0.000
    assert cloned["log_loss"] < prior["log_loss"] - 0.03, (cloned["log_loss"], prior["log_loss"])
    assert cloned["reads_options_ci_low"] > 0.05, cloned["reads_options"]
    assert abs(cloned["reads_viewer"]) < 0.05  # nothing of the viewer decides the marker rung
