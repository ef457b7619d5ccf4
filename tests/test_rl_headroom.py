"""bench/rl_headroom.py reads q as the log_score reward reads it: a bench that drifted from the
reward's API (it once called ``distributions`` with the old signature and died on its first
model) would bound nothing. On the tiny policy, two validation rows."""

from __future__ import annotations

import math
import random

import pytest


def _bench():
    from bench_scripts import load

    return load("rl_headroom")


def test_the_headroom_bench_scores_q_as_the_log_score_reward_does(
    tiny_policy, tiny_discriminator, small_clean
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.tasks.slate.contract import read_dataset
    from grail.tasks.slate.prompts import to_example
    from grail.tasks.slate.rewards import LogScoreReward

    bench = _bench()
    rows = read_dataset(small_clean, split="validation").to_pylist()[:2]
    examples = [to_example(r) for r in rows]
    q = bench.policy_q(tiny_policy, examples)
    reward = LogScoreReward()
    reward.bind(
        AutoModelForCausalLM.from_pretrained(tiny_policy),
        AutoTokenizer.from_pretrained(tiny_policy),
    )
    golds = [e["gold_index"] for e in examples]
    scored = reward(
        [e["prompt"] for e in examples],
        ["<think></think><answer>1</answer>"] * 2,
        gold_index=golds,
        n_options=[e["n_options"] for e in examples],
    )
    assert [len(row) for row in q] == [e["n_options"] for e in examples]
    for row, gold, score in zip(q, golds, scored, strict=True):
        assert math.log(max(row[gold - 1], 1e-3)) == pytest.approx(score, abs=1e-5)

    # both discriminators fit on pairs (the person's choice, a draw from q) and score them
    real, fake = bench.pairs_for(examples, q, random.Random(0))
    by_id = {id(e): r for e, r in zip(examples, rows, strict=True)}
    for fit in (
        bench.tiny_discriminator(tiny_discriminator, 2, 0),
        bench.logistic_discriminator(by_id),
    ):
        logits = fit(real + fake)(real + fake)
        assert len(logits) == 4 and all(math.isfinite(x) for x in logits)

    uniform = [[1 / e["n_options"]] * e["n_options"] for e in examples]
    spread = bench.thought_spread(tiny_policy, examples, uniform, 2, 1.0, 12)
    assert 0 <= spread["flat_rows"] <= 1 and 0 <= spread["answered"] <= 1
    assert 0 <= spread["non_empty_thoughts"] <= 1 and spread["within_std"] >= 0
    # expected log-loss under the truth is never below the truth's entropy (Gibbs)
    for e, best, mean in zip(examples, spread["best"], spread["mean"], strict=True):
        assert min(best, mean) >= math.log(e["n_options"]) - 1e-9
