"""The embedded policy can learn to read. On the ladder's first rung (``grail simulate --choices
marker``: the option whose title opens with a marker word is chosen with probability 0.9
wherever it stands), the tiny policy built as the tiny-models task builds it, its format
warm-up reading the prompts as a language model (``--warmup-prompt-weight 1``), and cloned
by ``recipes/tiny/config_bc.yaml`` with enough steps beats the position prior by a clear
margin and reads the options. A change that stops the prompt reaching the answer (a
truncated prompt, the loss on the wrong token, a mask, a warm-up that no longer reads the
prompt) fails here.

The integration tier: the warm-up and 306 cloning steps take about 90 s on 2 cores, more than
the unit tier's 3 minutes leave. Measured: every run through these 306-312 steps read, 4 of 4
(39-83% of always-first's gap to the ceiling closed); with the demo's 39 steps, none; with 153
steps, 1 of 3 (docs/results.md#the-learnability-ladder)."""

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

pytestmark = pytest.mark.integration  # ~90 s of training

ROOT = Path(__file__).resolve().parents[1]
# enough cloning for the pointer to form (the demo's 39 steps are before it does)
READS = {
    "sft_batch_size": "16",
    "sft_learning_rate": "2.0e-3",
    "sft_num_train_epochs": "6",
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
    assert cloned["log_loss"] < prior["log_loss"] - 0.1, (cloned["log_loss"], prior["log_loss"])
    assert cloned["reads_options_ci_low"] > 0.1, cloned["reads_options"]
    assert abs(cloned["reads_viewer"]) < 0.05  # nothing of the viewer decides the marker rung
