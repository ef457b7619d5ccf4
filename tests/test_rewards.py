"""Rewards follow TRL's contract; the registry resolves names and dotted paths."""

from __future__ import annotations

import pytest

from grail.core.errors import GrailError
from grail.core.rewards import normalize_weights, resolve_rewards
from grail.tasks.slate.rewards import (
    REWARDS,
    accuracy_reward,
    format_reward,
    opinion_reward,
    parse_answer,
    tag_count_reward,
)


def _chat(text):
    return [{"role": "assistant", "content": text}]


def test_accuracy_on_plain_and_conversational_completions():
    completions = [
        _chat("<think>likes guns</think><answer>3</answer>"),
        "<answer>1</answer>",
        "<answer>0</answer>",
        "I pick 3",
        "<answer>2</answer><answer>3</answer>",
    ]
    rewards = accuracy_reward(["p"] * 5, completions, gold_index=[3, 2, 1, 3, 3], n_options=[4] * 5)
    assert rewards == [1.0, 0.0, 0.0, 0.0, 1.0]  # the last answer tag counts


def test_out_of_range_answers_score_zero_even_if_equal_to_gold():
    assert accuracy_reward(None, ["<answer>5</answer>"], gold_index=[5], n_options=[4]) == [0.0]
    assert parse_answer("<answer>5</answer>") == 5


def test_format_and_tag_count():
    good = "<think>a</think>\n<answer>2</answer>\n<opinion>increase</opinion>"
    assert format_reward(None, [good, "<think>a</think>", "<answer>2</answer>"]) == [1.0, 0, 0]
    assert tag_count_reward(None, [good, "<think><think></think>"]) == [1.0, 0.25]


def test_opinion_is_none_without_a_label():
    out = opinion_reward(
        None,
        [_chat("<opinion>decrease</opinion>")] * 3,
        opinion_direction=["decrease", "increase", None],
    )
    assert out == [1.0, 0.0, None]


def test_registry_names_paths_and_weights():
    assert {"accuracy", "format", "tag_count", "opinion"} <= set(REWARDS)
    funcs, weights = resolve_rewards(["accuracy", "tests_rewards_helper:double"], [3, 1], REWARDS)
    assert funcs[0] is accuracy_reward and weights == [0.75, 0.25]
    assert funcs[1](None, ["x", "y"]) == [2.0, 2.0]
    assert normalize_weights(None, 4) == [0.25] * 4
    with pytest.raises(GrailError, match="unknown reward 'speed'"):
        resolve_rewards(["speed"], None, REWARDS)
    with pytest.raises(GrailError, match="cannot import reward 'nope.module:f'"):
        resolve_rewards(["nope.module:f"], None, REWARDS)
    with pytest.raises(GrailError, match="2 reward weights for 1"):
        normalize_weights([1, 2], 1)
    with pytest.raises(GrailError, match="non-negative"):
        normalize_weights([-1, 2], 2)
