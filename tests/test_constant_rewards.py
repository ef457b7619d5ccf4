"""No silent dead runs: a training whose groups' rewards never spread says so in one line and
tags its MLflow run (grail.train.constant_rewards)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from grail.train.constant_rewards import TAG, ConstantRewardsCallback

DEAD = {"frac_reward_zero_std": 1.0, "rewards/accuracy_reward/std": 0.0, "rewards/format/std": 0.0}
ALIVE = {"frac_reward_zero_std": 0.5, "rewards/accuracy_reward/std": 0.3}


def _feed(callback, logs_by_step):
    for step, logs in logs_by_step:
        state = SimpleNamespace(is_world_process_zero=True, global_step=step)
        callback.on_log(None, state, None, logs=dict(logs))


def test_three_dead_steps_in_a_row_are_one_line_naming_the_constant_rewards(caplog):
    caplog.set_level(logging.WARNING, logger="grail.train")
    _feed(ConstantRewardsCallback(), [(1, DEAD), (2, DEAD), (3, ALIVE), (4, DEAD), (5, DEAD)])
    assert not caplog.records, "two dead steps in a row are not yet a dead run"
    _feed(cb := ConstantRewardsCallback(), [(s, DEAD) for s in range(1, 9)])
    (record,) = caplog.records
    message = record.getMessage()
    assert len(message.splitlines()) == 1
    assert "for 3 steps in a row" in message and message.startswith("step 3:")
    assert "constant over the batch: accuracy_reward, format" in message
    _feed(cb, [(9, ALIVE), (10, DEAD), (11, DEAD), (12, DEAD)])
    assert len(caplog.records) == 2 and caplog.records[1].getMessage().startswith("step 12:")


def test_a_log_over_several_steps_counts_them_all(caplog):
    """logging_steps 5 (the GPU recipes): one log that was dead for all of its 5 steps."""
    caplog.set_level(logging.WARNING, logger="grail.train")
    _feed(ConstantRewardsCallback(), [(5, DEAD)])
    assert "for 5 steps in a row" in caplog.records[0].getMessage()


def test_the_active_mlflow_run_gets_the_tag(tmp_path, monkeypatch):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the environment, as tasks set it: no
    with mlflow.start_run() as run:  # process-wide mlflow.set_tracking_uri left behind
        _feed(ConstantRewardsCallback(), [(s, DEAD) for s in (1, 2, 3)])
    tags = mlflow.MlflowClient(uri).get_run(run.info.run_id).data.tags
    assert tags[TAG] == "3 steps to step 3; constant: accuracy_reward, format"


@pytest.mark.integration
def test_a_real_grpo_run_on_a_constant_reward_says_so(tmp_path, tiny_policy, small_clean, caplog):
    """TRL's own logs drive it: a reward that is the same for every completion."""
    from tiny_settings import tiny_args

    from grail.train.config import parse_train_args
    from grail.train.stage import run

    caplog.set_level(logging.WARNING, logger="grail.train")
    args = tiny_args(small_clean, tiny_policy, tmp_path / "out", "--max_steps", 3)
    args += ["--reward_funcs", "tests_rewards_helper.nothing_to_learn", "--reward_weights", "1"]
    run(*parse_train_args(args))
    (record,) = [r for r in caplog.records if "every advantage was 0" in r.getMessage()]
    assert "constant over the batch: nothing_to_learn" in record.getMessage()
