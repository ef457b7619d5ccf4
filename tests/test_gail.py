"""GRAIL's discriminator: each documented switch changes behaviour, and the loss falls on a
separable toy set."""

from __future__ import annotations

import math
import random
import tempfile
from pathlib import Path

import pytest
import torch

from grail.core.errors import GrailError
from grail.tasks.slate.discriminator import choice_text, crossed_features
from grail.train.config import parse_train_args
from grail.train.gail import (
    LOGIT_CLIP,
    Discriminator,
    DiscriminatorCallback,
    DiscriminatorReward,
    FeatureDiscriminator,
    Judgement,
    Pretraining,
    ReplayBuffer,
    gail_reward,
    next_weight,
)
from grail.train.trainer import build_trainer

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
REAL = [
    f"CHOSEN 1. Raise the Wage to $15 Now, part {k}\n\nVIEWER\nparty Democrat" for k in range(8)
]
FAKE = [
    f"CHOSEN 2. The $15 Minimum Wage Will Kill Jobs, part {k}\n\nVIEWER\nparty Democrat"
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


def _callback(
    reward, size=64, minibatch=8, updates=1, learnable=False, weights=None, base=None, ceiling=0.5
):
    return DiscriminatorCallback(
        reward,
        ReplayBuffer(size, seed=0),
        minibatch=minibatch,
        updates_per_step=updates,
        reward_weights=weights,
        base_weights=base,
        learnable_weight=learnable,
        max_weight=ceiling,
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


def test_reward_is_alpha_times_the_clipped_logit_and_neutral_for_invalid_answers(
    discriminator,
):
    """GAIL's log D - log(1 - D): the discriminator's logit, clipped, scaled by alpha. A reply
    that names no option of its slate (none, or option 7 of 3) is no negative and gets its
    group's mean: the format reward judges it, not the discriminator."""
    completions = _answers(1, 2, 7) + [[{"role": "assistant", "content": "no answer"}]]
    columns = {"gold_index": [1] * 4, "n_options": [3] * 4}
    reward = DiscriminatorReward(discriminator, alpha=1.0)
    one = reward([PROMPT] * 4, completions, **columns)
    three = DiscriminatorReward(discriminator, alpha=3.0)([PROMPT] * 4, completions, **columns)
    assert one[2] == one[3] == pytest.approx((one[0] + one[1]) / 2)
    assert three == pytest.approx([3 * r for r in one])
    p_real = discriminator.p_real([choice_text(PROMPT, 1), choice_text(PROMPT, 2)])
    assert one[:2] == pytest.approx([math.log(p / (1 - p)) for p in p_real], abs=1e-5)
    assert sorted(label for _, label in reward.pending) == [0.0, 0.0, 1.0]  # 7 is no negative
    alone = [[{"role": "assistant", "content": "<answer>9</answer>"}]]
    assert reward([PROMPT], alone, gold_index=[1], n_options=[3]) == [None]


def test_buffer_gets_gold_as_real_and_every_policy_choice_as_fake(discriminator):
    """Every policy sample is a negative, the one that matches the person's choice too: only
    then is D = p / (p + pi) and the reward's optimum pi = p."""
    reward = DiscriminatorReward(discriminator)
    reward([PROMPT] * 3, _answers(1, 2, 3), gold_index=[1, 1, 1], n_options=[3] * 3)
    labels = sorted(label for _, label in reward.pending)
    assert labels == [0.0, 0.0, 0.0, 1.0]  # one gold per prompt; all three samples are fake
    assert reward.pending[0][0].startswith("CHOSEN 1. Raise the Wage")
    assert {t for t, label in reward.pending if label == 0.0} == {
        choice_text(PROMPT, k) for k in (1, 2, 3)
    }


def test_the_discriminator_sees_the_options_position():
    """The same video shown first and shown third are different choices to it: people favour
    the first slots, and a simulator must reproduce that."""
    moved = [
        PROMPT[0],
        {"role": "user", "content": PROMPT[1]["content"].replace("1. Raise", "9. Raise")},
    ]
    assert choice_text(PROMPT, 1) != choice_text(moved, 1)
    assert choice_text(PROMPT, 1).startswith("CHOSEN 1. ")


def test_gail_rewards_fixed_point_is_peoples_distribution():
    """Against the optimal discriminator D = p / (p + pi), the expected reward
    E_pi[log D - log(1 - D)] = -KL(pi || p) is highest at pi = p: sharper (mode-seeking) and
    flatter policies earn less."""
    p = [0.5, 0.3, 0.15, 0.05]

    def expected(pi, reward):
        return sum(q * reward(pi, a) for a, q in enumerate(pi) if q > 0)

    def gail(pi, a):  # the optimal discriminator's logit, log p - log pi
        return gail_reward(math.log(p[a] / (p[a] + pi[a])) - math.log(pi[a] / (p[a] + pi[a])))

    generator = random.Random(0)
    at_p = expected(p, gail)
    assert at_p == pytest.approx(0.0, abs=1e-12)
    for _ in range(200):
        weights = [generator.random() + 1e-3 for _ in p]
        pi = [w / sum(weights) for w in weights]
        assert expected(pi, gail) < at_p
    sharper = [0.7, 0.2, 0.08, 0.02]
    assert expected(sharper, gail) < at_p
    flatter = [0.25, 0.25, 0.25, 0.25]
    assert expected(flatter, gail) < at_p


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
    from grail.train.tiny import build_tiny_model

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
    assert all(-LOGIT_CLIP < r < LOGIT_CLIP for r in rewards) and frozen.pending == []
    off = DiscriminatorReward(discriminator, eval_mode="off")
    off.policy = policy
    assert off([PROMPT] * 2, _answers(2, 3), gold_index=[1, 1], n_options=[3, 3]) == [None] * 2
    policy.train()
    assert off([PROMPT], _answers(2), gold_index=[1], n_options=[3])[0] is not None
    assert off.pending


def test_learnable_weight_starts_at_zero_and_follows_accuracy_on_fresh_pairs(tiny_discriminator):
    trajectories = {}
    for learnable in (False, True):
        torch.manual_seed(0)
        disc = Discriminator(str(tiny_discriminator), device="cpu", lr=3e-3, max_length=64)
        reward = DiscriminatorReward(disc)
        weights = torch.tensor([0.4, 0.1, 0.5])  # base 0.8/0.2 mixed with w = 0.5
        callback = _callback(
            reward, minibatch=16, learnable=learnable, weights=weights, base=[0.8, 0.2]
        )
        trajectory = [weights[-1].item()]
        for _ in range(40):
            reward.pending = [(t, 1.0) for t in REAL] + [(t, 0.0) for t in FAKE]  # fresh pairs
            _step(callback)
            trajectory.append(weights[-1].item())
            assert weights.sum().item() == pytest.approx(1.0)
            assert (weights[0] / weights[1]).item() == pytest.approx(4.0)  # base ratio kept
        trajectories[learnable] = trajectory
    assert trajectories[False] == pytest.approx([0.5] * 41)
    learned = trajectories[True]
    # An untrained discriminator gets no say; as it learns to tell the toy set apart (on pairs
    # it has not trained on yet) its weight climbs toward the 0.5 ceiling.
    assert learned[0] == 0.0
    assert learned[-1] > 0.3 and learned == sorted(learned)


@pytest.mark.parametrize(("real", "policy"), [(32, 53), (53, 32)])
def test_a_chance_discriminator_gets_no_weight_whatever_the_class_balance(real, policy):
    """On 32 real to 53 policy pairs a discriminator that calls everything by its bias scores
    0.38 or 0.62 in plain accuracy; its balanced accuracy is 0.5 and its weight 0. One whose
    calls are coin flips stays at 0 too (the standard error), one that separates gets weight."""
    pairs = [(1.0, real), (0.0, policy)]
    for bias in (0.2, 0.8):  # calls everything policy, or everything real
        judged = Judgement.of([(bias, label) for label, n in pairs for _ in range(n)])
        assert judged.balanced_accuracy == 0.5 and judged.edge() == 0.0
        assert next_weight(0.0, judged, 0.5) == 0.0
    coins = random.Random(0)
    flips = [
        Judgement.of([(coins.random(), label) for label, n in pairs for _ in range(n)])
        for _ in range(200)
    ]
    assert sum(j.edge() == 0.0 for j in flips) >= 160  # the edge is > 0 by noise in <= 20%
    assert sum(j.edge() for j in flips) / len(flips) < 0.03
    separating = Judgement.of(
        [(0.9 if k % 5 else 0.1, 1.0) for k in range(real)]
        + [(0.1 if k % 5 else 0.9, 0.0) for k in range(policy)]
    )  # 80% right on each side
    assert separating.edge() > 0.4 and next_weight(0.0, separating, 0.5) > 0.02


def test_pretraining_sets_a_positive_weight_before_the_first_step(discriminator, monkeypatch):
    """GAIL's discriminator learns people's choices against the start model's own samples
    before step 1, and is judged on held-out prompts: a policy whose samples differ from
    people's gets a positive weight at step 1; one that samples as people choose gets 0."""
    import grail.train.gail as gail

    rows = [(PROMPT, 1, 3)] * 48  # people pick option 1
    plan = Pretraining(rows=rows, updates=60, max_new_tokens=12)
    for policy_picks, separable in ((3, True), (1, False)):
        monkeypatch.setattr(
            gail,
            "sample_replies",
            lambda model, tokenizer, prompts, *_, pick=policy_picks: (
                [f"<think></think><answer>{pick}</answer>"] * len(prompts)
            ),
        )
        torch.manual_seed(0)
        reward = DiscriminatorReward(discriminator)
        weights = torch.tensor([0.7, 0.3])
        callback = _callback(
            reward, size=128, minibatch=16, learnable=True, weights=weights, base=[1.0]
        )
        callback.pretraining = plan
        callback.on_train_begin(None, None, None, model=torch.nn.Linear(1, 1))
        record = callback.pretrained
        assert record["prompts"] == 48 and record["held_out_pairs"] == 24
        assert len(callback.buffer) == 96 and callback.updates == 60
        if separable:
            assert record["held_out_balanced_accuracy"] == 1.0
            assert weights[-1].item() == pytest.approx(callback.weight) and callback.weight > 0.4
        else:  # the same texts on both sides: nothing to tell apart
            assert weights[-1].item() == callback.weight == 0.0
        assert reward.stats["gail/weight"] == callback.weight


def test_learnable_weight_falls_when_fresh_pairs_are_at_chance(discriminator, monkeypatch):
    chance = Judgement(1.0, 0.0, 1, 1)
    monkeypatch.setattr(discriminator, "judged", lambda pairs, known: chance if pairs else None)
    reward = DiscriminatorReward(discriminator)
    weights = torch.tensor([0.5, 0.5])
    callback = _callback(reward, learnable=True, weights=weights, base=[1.0])
    callback.set_weight(0.4)  # e.g. restored from a checkpoint
    for _ in range(20):
        reward.pending = [(REAL[0], 1.0), (FAKE[0], 0.0)]
        _step(callback)
    assert weights[1] < 0.06 and weights.sum() == pytest.approx(1.0)
    before = callback.weight
    _step(callback)  # no fresh pairs: nothing to judge the discriminator by
    assert callback.weight == before


def test_fresh_pairs_are_scored_before_they_enter_the_buffer(discriminator, monkeypatch):
    seen = []
    original = discriminator.judged
    reward = DiscriminatorReward(discriminator)
    callback = _callback(reward, learnable=True)

    def judged(pairs, known):
        seen.append((len(pairs), len(callback.buffer)))
        return original(pairs, known)

    monkeypatch.setattr(discriminator, "judged", judged)
    reward.pending = [(t, 1.0) for t in REAL[:3]] + [(t, 0.0) for t in FAKE[:3]]
    _step(callback)
    assert seen == [(6, 0)] and len(callback.buffer) == 6
    assert "gail/fresh_balanced_accuracy" in reward.stats


def test_fresh_accuracy_reuses_the_rewards_scores_and_scores_each_other_text_once(
    discriminator, monkeypatch
):
    reward = DiscriminatorReward(discriminator)
    callback = _callback(reward)
    # gold 1; replies 2, 2, 3 and 1 (the gold pick: the real text, scored as a reply)
    reward([PROMPT] * 4, _answers(2, 2, 3, 1), gold_index=[1] * 4, n_options=[3] * 4)
    assert len(reward.pending) == 5 and len(reward.scored) == 3  # 1 real, 4 fake; 3 texts
    rewarded = dict(reward.scored)
    scored, original = [], discriminator.p_real
    monkeypatch.setattr(discriminator, "p_real", lambda texts: scored.append(texts) or [])
    _step(callback)
    assert scored == [[]]  # every fresh text had its reward's score
    real = [rewarded[t] > 0.5 for t, label in callback.buffer.pairs if label == 1.0]
    fake = [rewarded[t] <= 0.5 for t, label in callback.buffer.pairs if label == 0.0]
    balanced = (sum(real) / len(real) + sum(fake) / len(fake)) / 2
    assert reward.stats["gail/fresh_balanced_accuracy"] == pytest.approx(balanced)
    assert reward.scored == {} and reward.pending == []
    monkeypatch.setattr(
        discriminator, "p_real", lambda texts: scored.append(texts) or original(texts)
    )
    reward.pending = [(REAL[0], 1.0), (REAL[0], 1.0), (FAKE[0], 0.0)]  # another rank's pairs
    _step(callback)
    assert scored[-1] == [REAL[0], FAKE[0]]


@pytest.mark.parametrize(
    ("weight", "judged", "ceiling", "expected"),
    [
        (0.0, (1.0, 1.0), 0.5, 0.05),  # perfect: a tenth of the way to the ceiling
        (0.0, (0.5, 0.5), 0.5, 0.0),  # chance: no say
        (0.0, (1.0, 0.0), 0.5, 0.0),  # all called real: chance whatever the balance
        (0.2, (0.0, 0.0), 0.5, 0.18),  # worse than chance counts as chance
        (0.2, None, 0.5, 0.2),  # no fresh pairs: unchanged
        (0.0, (1.0, 1.0), 1.0, 0.1),  # gail_weight 1
        (0.0, (1.0, 1.0), 0.0, 0.0),  # gail_weight 0
    ],
)
def test_every_edge_of_the_weight_rule(weight, judged, ceiling, expected):
    judgement = Judgement(*judged, 400, 400) if judged else None
    assert next_weight(weight, judgement, ceiling) == pytest.approx(expected)


def test_the_edge_is_balanced_accuracy_less_one_standard_error():
    judged = Judgement(0.75, 0.75, 400, 400)  # standard error 0.5 * sqrt(2 * 0.1875 / 400)
    assert judged.edge() == pytest.approx(2 * (0.75 - 0.5 * math.sqrt(0.375 / 400)) - 1)
    assert next_weight(0.2, judged, 0.5) == pytest.approx(0.2 + 0.1 * (0.5 * judged.edge() - 0.2))


def test_gail_weight_one_leaves_no_base_weight_and_no_division_by_zero(discriminator):
    reward = DiscriminatorReward(discriminator)
    weights = torch.tensor([0.0, 0.0, 1.0])  # the trainer's tensor with gail_weight = 1
    callback = _callback(reward, learnable=True, weights=weights, base=[0.8, 0.2], ceiling=1.0)
    assert weights.tolist() == pytest.approx([0.8, 0.2, 0.0])  # starts at 0: base only
    reward.pending = [(t, 1.0) for t in REAL] + [(t, 0.0) for t in FAKE]
    _step(callback)
    assert torch.isfinite(weights).all() and weights.sum().item() == pytest.approx(1.0)
    callback.set_weight(1.0)
    assert weights.tolist() == pytest.approx([0.0, 0.0, 1.0])


def test_discriminator_loads_whole_and_in_fp32_under_zero3(tiny_discriminator, monkeypatch):
    """GRPOConfig with a ZeRO-3 config registers it with transformers; from_pretrained then builds
    every model inside deepspeed.zero.Init, partitioned. The discriminator must stay whole."""
    from transformers import AutoModelForSequenceClassification
    from transformers.integrations import deepspeed as hf_deepspeed

    class Zero3:  # what HfTrainerDeepSpeedConfig answers under a ZeRO-3 config
        config = {"zero_optimization": {"stage": 3}}

        def is_zero3(self):
            return True

    flag = Zero3()
    hf_deepspeed.set_hf_deepspeed_config(flag)
    try:
        assert hf_deepspeed.is_deepspeed_zero3_enabled()
        with pytest.raises(Exception):  # noqa: B017 (no deepspeed here: zero.Init cannot even start)
            AutoModelForSequenceClassification.from_pretrained(str(tiny_discriminator))
        disc = Discriminator(str(tiny_discriminator), device="cpu")
        embedding = disc.model.get_input_embeddings().weight
        assert embedding.numel() == disc.model.config.vocab_size * disc.model.config.hidden_size
        assert {p.dtype for p in disc.model.parameters()} == {torch.float32}
        assert disc.tokenizer.pad_token is not None
        assert disc.model.config.pad_token_id == disc.tokenizer.pad_token_id
        assert hf_deepspeed.is_deepspeed_zero3_enabled()  # the trainer's setting is back
    finally:
        hf_deepspeed.unset_hf_deepspeed_config()


def test_max_grad_norm_clips_the_discriminator_update(tiny_discriminator):
    norms = {}
    for clip in (0.0, 1e-6):
        torch.manual_seed(0)
        disc = Discriminator(
            str(tiny_discriminator), device="cpu", lr=1e-2, max_length=64, max_grad_norm=clip
        )
        before = [p.detach().clone() for p in disc.model.parameters()]
        disc.update(REAL[:2] + FAKE[:2], [1.0, 1.0, 0.0, 0.0])
        norms[clip] = sum(
            (a - b).norm().item() for a, b in zip(before, disc.model.parameters(), strict=True)
        )
    assert 0 < norms[1e-6] < norms[0.0]


def test_use_and_weight_switches_shape_the_trainer(
    tiny_policy, tiny_discriminator, small_clean, tmp_path
):
    base = [
        "--config",
        str(ROOT / "recipes" / "tiny" / "config_grail.yaml"),
        "--dataset",
        str(small_clean),
        "--model_name_or_path",
        str(tiny_policy),
        "--gail_discriminator",
        "classifier",
        "--gail_model",
        str(tiny_discriminator),
        "--output_dir",
        str(tmp_path / "o"),
        "--max_train_rows",
        "8",
        "--gail_learnable_weight",  # a fixed weight: the recipe learns it (from 0)
        "false",
    ]
    trainer, _ = build_trainer(*parse_train_args(base + ["--gail_weight", "0.2"]))
    assert trainer.reward_func_names[-1] == "discriminator"
    assert trainer.reward_weights.tolist() == pytest.approx([0.8 * 2 / 3, 0.8 / 6, 0.8 / 6, 0.2])
    trainer, _ = build_trainer(*parse_train_args(base + ["--gail_use", "false"]))
    assert "discriminator" not in trainer.reward_func_names
    assert trainer.reward_weights.tolist() == pytest.approx([2 / 3, 1 / 6, 1 / 6])


def test_context_switch_gives_the_discriminator_the_whole_slate(discriminator):
    """gail_context: 'choice' reads the chosen option and the viewer; 'slate' also the options
    the viewer chose among, for both real and policy pairs, and scores differ."""
    texts = {}
    for context in ("choice", "slate"):
        reward = DiscriminatorReward(discriminator, context=context)
        scores = reward([PROMPT] * 2, _answers(2, 3), gold_index=[1, 1], n_options=[3, 3])
        texts[context] = (reward.pending, scores)
    choice_pairs, choice_scores = texts["choice"]
    slate_pairs, slate_scores = texts["slate"]
    assert all("\nOPTIONS\n" not in t for t, _ in choice_pairs)
    assert all("\nOPTIONS\n1. Raise the Wage" in t for t, _ in slate_pairs)
    # the viewer before the slate: a text cut at gail_max_length keeps the viewer
    assert all(t.index("VIEWER") < t.index("\nOPTIONS\n") for t, _ in slate_pairs)
    assert [label for _, label in slate_pairs] == [label for _, label in choice_pairs]
    assert slate_scores != pytest.approx(choice_scores)
    with pytest.raises(GrailError, match="gail_context"):
        parse_train_args(
            ["--config", str(ROOT / "recipes/tiny/config_grail.yaml"), "--gail_context", "all"]
        )


def _viewer_pairs(count: int, seed: int) -> list[tuple[str, float]]:
    """People who lean left click the left-leaning video and those who lean right the other;
    the policy picks either whatever the viewer: only the viewer x choice cross tells them
    apart (each side's option words and positions are as frequent among real as policy)."""
    rng, pairs = random.Random(seed), []
    for k in range(count):
        lean = rng.choice(("left", "right"))
        videos = {"left": "1. Raise the Wage Now", "right": "2. The Wage Will Kill Jobs"}
        viewer = f"VIEWER\nleans {lean}; age {rng.randint(20, 70)}; viewer {k}"
        pairs.append((f"CHOSEN {videos[lean]}\n\n{viewer}", 1.0))
        pairs.append((f"CHOSEN {videos[rng.choice(('left', 'right'))]}\n\n{viewer}", 0.0))
    return pairs


def test_the_feature_discriminator_learns_a_viewer_by_choice_cross_from_few_pairs():
    """gail_discriminator: features learns, in 100 updates on 200 pairs, the interaction that
    a classifier trained from scratch could not find in the demo (it tells held-out viewers'
    choices apart); it saves and restores its weights and optimizer exactly."""
    torch.manual_seed(0)
    disc = FeatureDiscriminator(crossed_features, lr=0.05)
    buffer = ReplayBuffer(1000, seed=0)
    buffer.extend(_viewer_pairs(100, seed=0))
    untrained = disc.judged(_viewer_pairs(100, seed=1))
    for _ in range(100):
        batch = buffer.sample(16)
        disc.update([t for t, _ in batch], [y for _, y in batch])
    held_out = _viewer_pairs(100, seed=1)
    judged = disc.judged(held_out)
    assert untrained.edge() == 0.0 and untrained.balanced_accuracy == 0.5
    # the best any discriminator can do is 0.75: half the policy's picks are people's own
    assert judged.balanced_accuracy > 0.65 and judged.edge() > 0.1, judged
    copy = FeatureDiscriminator(crossed_features, lr=0.05)
    with tempfile.TemporaryDirectory() as folder:
        disc.save(Path(folder))
        copy.load(Path(folder))
    texts = [t for t, _ in held_out[:8]]
    assert copy.logits(texts) == disc.logits(texts) and copy.sha256() == disc.sha256()
    batch = buffer.sample(16)  # the same next update on both: the optimizer state came along
    for replica in (disc, copy):
        replica.update([t for t, _ in batch], [y for _, y in batch])
    assert copy.sha256() == disc.sha256()


def test_the_discriminator_switch_builds_the_named_kind_and_refuses_what_it_does_not_read(
    tiny_policy, tiny_discriminator, small_clean, tmp_path
):
    base = ["--config", str(ROOT / "recipes/tiny/config_grail.yaml"), "--dataset",
            str(small_clean), "--model_name_or_path", str(tiny_policy), "--output_dir",
            str(tmp_path / "o"), "--max_train_rows", "8"]  # fmt: skip
    kinds = {}
    for extra in (
        [],
        ["--gail_discriminator", "classifier", "--gail_model", str(tiny_discriminator)],
    ):
        trainer, _ = build_trainer(*parse_train_args(base + extra))
        kinds[bool(extra)] = type(trainer.reward_funcs[-1].discriminator)
    assert kinds == {False: FeatureDiscriminator, True: Discriminator}
    with pytest.raises(GrailError, match="gail_model is read by gail_discriminator: classifier"):
        parse_train_args(base + ["--gail_model", str(tiny_discriminator)])
    with pytest.raises(GrailError, match="gail_discriminator must be"):
        parse_train_args(base + ["--gail_discriminator", "tree"])
    with pytest.raises(GrailError, match="gail_model is not set"):
        parse_train_args(base + ["--gail_discriminator", "classifier"])
