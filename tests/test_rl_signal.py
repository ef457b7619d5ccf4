"""Whether RL had signal, in words, and the guard that stops a run without it
(grail.train.rl_signal): the share of groups without spread on constructed groups, the line,
the stop, the verdict, the MLflow tag; a real GRPO run on a constant reward."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from grail.train.rl_signal import (
    SPREAD_FLOOR,
    TAG,
    RLSignal,
    Step,
    group_spread,
    thought_tags,
    thoughts,
)

EMPTY = (0, 0)  # no reply with a thought


def _steps(signal, batches, start=1):
    """Feed one generation batch per step: ([total rewards], group size)."""
    control = SimpleNamespace(should_training_stop=False)
    for step, (rewards, size) in enumerate(batches, start):
        signal.observe(rewards, size, len(rewards), EMPTY, None)
        signal.on_step_end(None, SimpleNamespace(global_step=step), control)
    return control


FLAT = ([-1.2] * 8, 2)  # 4 groups of 2, every completion the same: no signal
ROUNDING = ([-1.2, -1.2 + 1e-6] * 4, 2)  # spread at fp32 rounding: no signal either
LIVE = ([-1.2, -0.4] * 4, 2)  # every group spreads


def test_the_share_of_groups_without_spread_on_constructed_groups():
    assert group_spread(FLAT[0], 2)[:2] == (4, 4)
    assert group_spread(ROUNDING[0], 2)[:2] == (4, 4)
    assert group_spread(LIVE[0], 2)[:3] == (4, 0, 0.4)
    # 127 of 128 groups equal (the demo's step 2): a malformed reply is not a signal
    rewards = [-1.3] * 254 + [-1.3, -6.9]
    groups, zero, within, between = group_spread(rewards, 2)
    assert (groups, zero, between) == (128, 127, 0.2465)
    assert Step(2, groups, zero, within, between, 0.0, 0.0).has_signal is False
    # a group just above the floor has spread; NaN (no reward applied) is left out
    assert group_spread([0.0, 2.1 * SPREAD_FLOOR, 1.0, float("nan")], 2)[:2] == (2, 1)


def test_thoughts_are_counted_with_their_length():
    assert thoughts(["<think>a b</think><answer>1</answer>", "<think> </think>", "x"]) == (1, 3)


def test_warns_once_in_one_line_after_patience_steps_without_signal(caplog):
    caplog.set_level(logging.WARNING, logger="grail.train")
    signal = RLSignal("warn", patience=3)
    control = _steps(signal, [FLAT, FLAT, LIVE, FLAT, ROUNDING])
    assert not caplog.records and not control.should_training_stop
    control = _steps(signal, [FLAT, FLAT, FLAT], start=6)
    (record,) = caplog.records
    line = record.getMessage()
    assert len(line.splitlines()) == 1 and line.startswith("step 6: RL had no signal for 3")
    assert "12 of 12 groups had equal rewards; the policy writes no thought" in line
    assert not control.should_training_stop and signal.stopped_at is None


def test_stop_ends_training_after_patience_steps_and_says_so(caplog):
    caplog.set_level(logging.WARNING, logger="grail.train")
    signal = RLSignal("stop", patience=2)
    control = _steps(signal, [FLAT, LIVE, FLAT])
    assert not control.should_training_stop
    control = _steps(signal, [FLAT], start=4)
    assert control.should_training_stop and signal.stopped_at == 4
    assert "training stopped; the result is the start model" in caplog.records[0].getMessage()
    verdict = signal.verdict()
    assert verdict.startswith("RL had little signal: 12 of 16 groups had equal rewards")
    assert verdict.endswith("stopped at step 4 (rl_signal_guard: stop)")


def test_the_verdict_in_words():
    signal = RLSignal()
    assert signal.verdict() is None
    _steps(signal, [LIVE, LIVE])
    assert signal.verdict() == (
        "RL had signal: 0 of 8 groups had equal rewards over 2 steps (mean within-group reward "
        "std 0.4); the policy writes no thought"
    )
    thinking = RLSignal()
    thinking.observe(*LIVE, 8, (6, 120), 0.12)
    thinking.on_step_end(None, SimpleNamespace(global_step=1), SimpleNamespace())
    assert thinking.verdict().endswith(
        "; 75% of replies have a thought; GAIL's weight 0.12 at step 1, 0.12 at the last"
    )
    # a learnable weight that pre-training left at 0 says why (the demo's GRAIL)
    chance = RLSignal()
    chance.discriminator = SimpleNamespace(
        pretrained={"held_out_pairs": 120, "held_out_balanced_accuracy": 0.452}
    )
    for step, weight in enumerate((0.0, 0.0017), 1):
        chance.observe(*LIVE, 8, EMPTY, weight)
        chance.on_step_end(None, SimpleNamespace(global_step=step), SimpleNamespace())
    assert chance.verdict().endswith(
        "; GAIL's weight 0 at step 1 (after pre-training, its balanced accuracy on 120 held-out "
        "pairs was 0.452: not above chance by a standard error), 0.0017 at the last"
    )
    record = thinking.record()
    assert record["rl_signal_steps"][0]["thought_chars"] == 20.0
    json.dumps(record)  # summary.json takes it
    # a summarizer's replies carry no <think> tag at all: nothing is said of thoughts
    summarizer = RLSignal()
    summarizer.observe(*LIVE, 8, (0, 0, 0), None)
    summarizer.on_step_end(None, SimpleNamespace(global_step=1), SimpleNamespace())
    assert summarizer.verdict() == (
        "RL had signal: 0 of 4 groups had equal rewards over 1 steps (mean within-group reward "
        "std 0.4)"
    )
    tags = ["<keep>[a]</keep>", "<think></think><answer>2</answer>", "x</think><answer>1"]
    assert thought_tags(tags) == 2  # the last: the prompt opened its thought


def test_each_log_gets_the_steps_since_the_last_one():
    signal = RLSignal()
    _steps(signal, [FLAT, LIVE])
    logs = {"loss": 0.1}
    signal.on_log(None, None, None, logs=logs)
    assert logs["rl/zero_spread_share"] == 0.5 and logs["rl/within_group_std"] == 0.2
    assert "rl/gail_weight" not in logs
    again = {"loss": 0.1}
    signal.on_log(None, None, None, logs=again)
    assert again == {"loss": 0.1}  # nothing new since


@pytest.mark.integration
def test_a_real_grpo_run_on_a_constant_reward_stops_and_keeps_its_start_model(
    tmp_path, tiny_policy, small_clean, monkeypatch
):
    """TRL's own rewards drive it: a reward that is the same for every completion stops the
    run after `patience` steps; its result is the cloned start model, byte for byte; the
    summary and the MLflow run say why."""
    import mlflow
    from tiny_settings import tiny_args

    from grail.train.config import parse_train_args
    from grail.train.stage import run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # a fresh store: the experiment another test's process-wide state may name is not in it
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "rl-signal")
    out = tmp_path / "out"
    args = tiny_args(small_clean, tiny_policy, out, "--max_steps", 6, "--report_to", "mlflow")
    args += ["--reward_funcs", "tests_rewards_helper.nothing_to_learn", "--reward_weights", "1"]
    args += ["--rl_signal_guard", "stop", "--rl_signal_patience", "2", "--save_steps", "10"]
    summary = run(*parse_train_args(args))
    assert summary["global_step"] == 2 and summary["rl_signal_stopped_at"] == 2
    assert summary["rl_signal"].startswith("RL had no signal: 4 of 4 groups had equal rewards")
    saved = json.loads((out / "summary.json").read_text())
    assert saved["rl_signal"] == summary["rl_signal"]
    start = out / "sft" / "model.safetensors"
    assert (out / "model.safetensors").read_bytes() == start.read_bytes()
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert any(r.data.tags.get(TAG) == summary["rl_signal"] for r in runs)
