"""GRAIL's discriminator: each documented switch changes behaviour, and the loss falls on a
separable toy set."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grail.config import parse_train_args
from grail.errors import GrailError
from grail.gail import Discriminator, DiscriminatorCallback, DiscriminatorReward, ReplayBuffer
from grail.train import build_trainer

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [
    {"role": "system", "content": "s"},
    {
        "role": "user",
        "content": "VIEWER\nparty Democrat\n\nOPTIONS\n"
        "1. Raise the Wage to $15 Now (from Workers First TV)\n"
        "2. The $15 Minimum Wage Will Kill Jobs (from Free Market "
        "Minute)\n3. Minimum Wage by the Numbers (from EconExplained)",
    },
]
REAL = [f"CHOSEN Raise the Wage to $15 Now, part {k}\n\nVIEWER\nparty Democrat" for k in range(8)]
FAKE = [
    f"CHOSEN The $15 Minimum Wage Will Kill Jobs, part {k}\n\nVIEWER\nparty Democrat"
    for k in range(8)
]


@pytest.fixture
def discriminator(tiny_discriminator):
    torch.manual_seed(0)
    return Discriminator(str(tiny_discriminator), device="cpu", lr=3e-3, max_length=64)


def _answers(*options):
    return [
        [{"role": "assistant", "content": f"<think>x</think><answer>{o}</answer>"}] for o in options
    ]


def _callback(reward, size=64, minibatch=8, updates=1, learnable=False, weights=None):
    return DiscriminatorCallback(
        reward,
        ReplayBuffer(size, seed=0),
        minibatch=minibatch,
        updates_per_step=updates,
        reward_weights=weights,
        learnable_weight=learnable,
        max_weight=0.5,
    )


def _step(callback, n=1):
    for _ in range(n):
        callback.on_step_end(None, None, None)


def test_discriminator_loss_falls_on_a_separable_toy_set(discriminator):
    reward = DiscriminatorReward(discriminator)
    reward.pending = [(t, 1.0) for t in REAL] + [(t, 0.0) for t in FAKE]
    callback = _callback(reward, minibatch=16)
    losses = []
    for _ in range(40):
        _step(callback)
        losses.append(reward.stats["gail/disc_loss"])
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    assert reward.stats["gail/disc_accuracy"] == 1.0
    p_real, p_fake = discriminator.p_real([REAL[0], FAKE[0]])
    assert p_real > 0.8 > 0.2 > p_fake


def test_reward_is_alpha_times_p_real_and_zero_for_invalid_answers(discriminator):
    completions = _answers(1, 2) + [[{"role": "assistant", "content": "no answer"}]]
    columns = {"gold_index": [1, 1, 1], "n_options": [3, 3, 3]}
    one = DiscriminatorReward(discriminator, alpha=1.0)([PROMPT] * 3, completions, **columns)
    three = DiscriminatorReward(discriminator, alpha=3.0)([PROMPT] * 3, completions, **columns)
    assert one[2] == three[2] == 0.0
    assert three[:2] == pytest.approx([3 * r for r in one[:2]])
    assert all(0 < r < 1 for r in one[:2])


def test_buffer_gets_gold_as_real_and_differing_policy_choices_as_fake(discriminator):
    reward = DiscriminatorReward(discriminator)
    reward([PROMPT] * 3, _answers(1, 2, 3), gold_index=[1, 1, 1], n_options=[3] * 3)
    labels = sorted(label for _, label in reward.pending)
    assert labels == [0.0, 0.0, 1.0]  # one gold per prompt; the policy's matching pick is not fake
    assert reward.pending[0][0].startswith("CHOSEN Raise the Wage")


def test_learning_rate_zero_leaves_the_discriminator_unchanged(tiny_discriminator):
    for lr, should_change in ((0.0, False), (1e-2, True)):
        disc = Discriminator(str(tiny_discriminator), device="cpu", lr=lr, max_length=64)
        before = [p.detach().clone() for p in disc.model.parameters()]
        disc.update(REAL[:2] + FAKE[:2], [1.0, 1.0, 0.0, 0.0])
        changed = any(
            not torch.equal(a, b) for a, b in zip(before, disc.model.parameters(), strict=True)
        )
        assert changed is should_change


def test_model_switch_loads_a_different_classifier(tiny_discriminator, small_clean, tmp_path):
    from grail.tiny import build_tiny_model

    other = build_tiny_model(tmp_path / "other", data=small_clean, task="classifier", seed=5)
    a = Discriminator(str(tiny_discriminator), device="cpu").p_real(REAL[:2])
    b = Discriminator(str(other), device="cpu").p_real(REAL[:2])
    assert a != pytest.approx(b)


def test_device_switch_places_the_model_and_rejects_a_missing_gpu(tiny_discriminator):
    disc = Discriminator(str(tiny_discriminator), device="cpu")
    assert {p.device.type for p in disc.model.parameters()} == {"cpu"}
    if not torch.cuda.is_available():
        with pytest.raises(GrailError, match="no CUDA device"):
            Discriminator(str(tiny_discriminator), device="cuda")


def test_replay_size_bounds_the_buffer(discriminator):
    reward = DiscriminatorReward(discriminator)
    callback = _callback(reward, size=5)
    reward.pending = [(t, 1.0) for t in REAL]
    _step(callback)
    assert len(callback.buffer) == 5
    assert [t for t, _ in callback.buffer.pairs] == REAL[-5:]  # oldest dropped first


def test_minibatch_and_updates_per_step(discriminator, monkeypatch):
    calls = []
    monkeypatch.setattr(
        discriminator, "update", lambda texts, labels: calls.append(labels) or (0.5, 0.5)
    )
    reward = DiscriminatorReward(discriminator)
    reward.pending = [(t, 1.0) for t in REAL] + [(t, 0.0) for t in FAKE]
    _step(_callback(reward, minibatch=6, updates=3))
    assert len(calls) == 3 and all(len(c) == 6 and sum(c) == 3 for c in calls)
    calls.clear()
    _step(_callback(reward, updates=0))
    assert calls == []


def test_eval_mode_frozen_scores_without_learning_and_off_gives_no_reward(discriminator):
    policy = torch.nn.Linear(1, 1)
    policy.eval()
    frozen = DiscriminatorReward(discriminator, eval_mode="frozen")
    frozen.policy = policy
    rewards = frozen([PROMPT] * 2, _answers(2, 3), gold_index=[1, 1], n_options=[3, 3])
    assert all(0 < r < 1 for r in rewards) and frozen.pending == []
    off = DiscriminatorReward(discriminator, eval_mode="off")
    off.policy = policy
    assert off([PROMPT] * 2, _answers(2, 3), gold_index=[1, 1], n_options=[3, 3]) == [None] * 2
    policy.train()
    assert off([PROMPT], _answers(2), gold_index=[1], n_options=[3])[0] > 0
    assert off.pending


def test_learnable_weight_moves_the_trainers_reward_weights(tiny_discriminator):
    trajectories = {}
    for learnable in (False, True):
        torch.manual_seed(0)
        disc = Discriminator(str(tiny_discriminator), device="cpu", lr=3e-3, max_length=64)
        reward = DiscriminatorReward(disc)
        reward.pending = [(t, 1.0) for t in REAL] + [(t, 0.0) for t in FAKE]
        weights = torch.tensor([0.4, 0.1, 0.5])  # base 0.8/0.2 mixed with w = 0.5
        callback = _callback(reward, minibatch=16, learnable=learnable, weights=weights)
        trajectory = []
        for _ in range(40):
            _step(callback)
            trajectory.append(weights[-1].item())
            assert weights.sum().item() == pytest.approx(1.0)
            assert (weights[0] / weights[1]).item() == pytest.approx(4.0)  # base ratio kept
        trajectories[learnable] = trajectory
    assert trajectories[False] == pytest.approx([0.5] * 40)
    learned = trajectories[True]
    # While the discriminator cannot tell real from policy choices its weight falls; as it
    # learns to separate the toy set the weight climbs back toward the 0.5 ceiling.
    assert min(learned) < 0.45
    assert learned[-1] > min(learned) + 0.02


def test_learnable_weight_falls_when_the_discriminator_cannot_tell(discriminator, monkeypatch):
    monkeypatch.setattr(discriminator, "update", lambda texts, labels: (0.69, 0.5))
    reward = DiscriminatorReward(discriminator)
    reward.pending = [(t, 1.0) for t in REAL] + [(t, 0.0) for t in FAKE]
    weights = torch.tensor([0.5, 0.5])
    _step(_callback(reward, learnable=True, weights=weights), 20)
    assert weights[1] < 0.1 and weights.sum() == pytest.approx(1.0)


def test_use_and_weight_switches_shape_the_trainer(
    tiny_model, tiny_discriminator, small_clean, tmp_path
):
    base = [
        "--config",
        str(ROOT / "recipes" / "tiny" / "config_grail.yaml"),
        "--dataset",
        str(small_clean),
        "--model_name_or_path",
        str(tiny_model),
        "--gail_model",
        str(tiny_discriminator),
        "--output_dir",
        str(tmp_path / "o"),
        "--max_train_rows",
        "8",
    ]
    trainer, _ = build_trainer(*parse_train_args(base + ["--gail_weight", "0.2"]))
    assert trainer.reward_func_names[-1] == "discriminator"
    assert trainer.reward_weights.tolist() == pytest.approx([0.8 * 2 / 3, 0.8 / 6, 0.8 / 6, 0.2])
    trainer, _ = build_trainer(*parse_train_args(base + ["--gail_use", "false"]))
    assert "discriminator" not in trainer.reward_func_names
    assert trainer.reward_weights.tolist() == pytest.approx([2 / 3, 1 / 6, 1 / 6])
