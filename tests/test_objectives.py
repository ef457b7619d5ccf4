"""The objectives a simulator of people trains on: proper scoring rules are maximised at
people's own distribution, the accuracy reward is not; the log-score reward reads the policy's
choice distribution as the benchmark does; behaviour cloning's loss weighs the option token
fully and the format lightly; the collapse guard fires on a recipe whose accuracy optimum is
worse than uniform."""

from __future__ import annotations

import math
import random

import pytest
import torch
from tiny_settings import TINY_GRPO, tiny_args

from grail.core.rewards import resolve_rewards
from grail.tasks.slate.rewards import (
    REWARDS,
    BrierReward,
    LogScoreReward,
    accuracy_optimum_log_loss,
    log_score,
    quadratic_score,
)
from grail.train.config import parse_train_args

PEOPLE = [0.45, 0.25, 0.2, 0.1]  # a slate's true choice distribution


def expected_score(rule, q, p=PEOPLE) -> float:
    """E over the person's choice y ~ p of rule(q, y)."""
    return sum(p[y - 1] * rule(q, y) for y in range(1, len(p) + 1))


def expected_accuracy(pi, p=PEOPLE) -> float:
    """The accuracy reward's expected value when the policy samples its answer from pi."""
    return sum(a * b for a, b in zip(pi, p, strict=True))


def random_distributions(count: int, size: int, seed: int = 0):
    generator = random.Random(seed)
    for _ in range(count):
        weights = [generator.random() ** 3 + 1e-3 for _ in range(size)]
        yield [w / sum(weights) for w in weights]


@pytest.mark.parametrize("rule", [log_score, quadratic_score])
def test_proper_scores_expected_value_is_highest_at_peoples_distribution(rule):
    at_p = expected_score(rule, PEOPLE)
    for q in random_distributions(500, len(PEOPLE)):
        assert expected_score(rule, q) < at_p
    collapsed = [1.0, 0.0, 0.0, 0.0]  # always the likeliest option
    assert expected_score(rule, collapsed) < at_p


def test_the_accuracy_rewards_expected_value_is_highest_when_collapsed():
    """Mode-seeking: all mass on the likeliest option earns more than people's distribution."""
    collapsed = [1.0, 0.0, 0.0, 0.0]
    assert expected_accuracy(collapsed) == max(PEOPLE)
    assert expected_accuracy(collapsed) > expected_accuracy(PEOPLE)
    assert all(
        expected_accuracy(q) <= expected_accuracy(collapsed) + 1e-12
        for q in random_distributions(200, len(PEOPLE))
    )


def test_log_score_is_floored_and_brier_bounded():
    assert log_score([1.0, 0.0], 2) == pytest.approx(math.log(1e-3))
    assert quadratic_score([0.0, 1.0], 1) == -1.0 and quadratic_score([1.0, 0.0], 1) == 1.0


def test_policy_rewards_are_classes_each_trainer_instantiates():
    funcs, _ = resolve_rewards(["log_score", "brier", "format"], None, REWARDS)
    assert funcs[:2] == [LogScoreReward, BrierReward] and REWARDS["format"] is funcs[2]
    assert LogScoreReward().__name__ == "log_score" and BrierReward().__name__ == "brier"


def _chat(text):
    return [{"role": "assistant", "content": text}]


def test_log_score_reward_reads_the_policys_distribution_as_the_benchmark_does(
    tiny_policy, small_clean
):
    """q comes from the policy's option-number probabilities after the completion's thought
    (the benchmark's own reading, answer_transformers); the sampled number does not enter; a
    completion without <answer> gets the floor; an unbound reward is one clear error."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.core.errors import GrailError
    from grail.inference.local import answer_transformers
    from grail.tasks.slate.contract import read_dataset
    from grail.tasks.slate.prompts import to_example

    rows = read_dataset(small_clean, split="validation").to_pylist()[:3]
    examples = [to_example(r) for r in rows]
    prompts = [e["prompt"] for e in examples]
    sizes = [e["n_options"] for e in examples]
    gold = [e["gold_index"] for e in examples]
    reward = LogScoreReward()
    with pytest.raises(GrailError, match="reads the policy"):
        reward(prompts, [_chat("<answer>1</answer>")] * 3, gold_index=gold, n_options=sizes)
    policy = AutoModelForCausalLM.from_pretrained(tiny_policy)
    reward.bind(policy, AutoTokenizer.from_pretrained(tiny_policy))
    thought = "<think></think><answer>"
    # the reply without a tag between two with one: each row keeps its own slate and score
    replies = [_chat(f"{thought}1</answer>"), _chat("no tag"), _chat(f"{thought}2</answer>")]
    scores = reward(prompts, replies, gold_index=gold, n_options=sizes)
    read = answer_transformers(str(tiny_policy), prompts, sizes, 12, 4).distributions
    # the benchmark reads each row after the model's own greedy thought: the same prefix here
    # whenever the greedy reply opens with an empty thought (the warmed-up tiny policy's)
    for row in (0, 2):
        assert scores[row] == pytest.approx(math.log(read[row][gold[row] - 1]), abs=1e-4)
    assert scores[1] == pytest.approx(math.log(1e-3))
    other = reward(
        prompts[:1], [_chat(f"{thought}3</answer>")], gold_index=gold[:1], n_options=sizes[:1]
    )
    assert other[0] == pytest.approx(scores[0], abs=1e-6)  # the sampled number is not scored
    brier = BrierReward()
    brier.bind(policy, reward.tokenizer)
    q = read[0]
    expected = 2 * q[gold[0] - 1] - sum(x * x for x in q)
    assert brier(prompts[:1], replies[:1], gold_index=gold[:1], n_options=sizes[:1])[0] == (
        pytest.approx(expected, abs=1e-4)
    )
    policy.train()  # a reward call leaves the policy's mode as it found it
    reward(prompts[:1], replies[:1], gold_index=gold[:1], n_options=sizes[:1])
    assert policy.training


def test_log_score_reads_each_prompt_once_and_finds_the_same_distributions(
    tiny_policy, small_clean
):
    """The reward's forward packs a chunk's completions of one prompt after one copy of it (as
    the scoring forwards pack each group): the same q as each completion read alone, to
    rounding, from fewer positions, in one forward per chunk (a collective under ZeRO-3)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.tasks.slate.contract import read_dataset
    from grail.tasks.slate.prompts import to_example
    from grail.train.trainer import prefix_packer

    examples = [to_example(r) for r in read_dataset(small_clean, split="validation").to_pylist()]
    two = examples[:2]
    thoughts = ["", "left", "the viewer likes long videos", "2 or 3"]
    prompts = [e["prompt"] for e in two for _ in thoughts]
    replies = [_chat(f"<think>{t}</think><answer>1</answer>") for _ in two for t in thoughts]
    gold = [e["gold_index"] for e in two for _ in thoughts]
    sizes = [e["n_options"] for e in two for _ in thoughts]
    policy = AutoModelForCausalLM.from_pretrained(tiny_policy)
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    packed, alone, unpacked = LogScoreReward(), LogScoreReward(), LogScoreReward()
    alone.chunk = 1  # a row per forward: nothing to share
    packed.bind(policy, tokenizer, prefix_packer(policy))
    alone.bind(policy, tokenizer, prefix_packer(policy))
    unpacked.bind(policy, tokenizer)  # share_group_prompts: false
    together = packed(prompts, replies, gold_index=gold, n_options=sizes)
    apart = alone(prompts, replies, gold_index=gold, n_options=sizes)
    assert packed.read["forwards"] == 1 and packed.read["packed"] == 1
    assert alone.read["forwards"] == len(prompts) and alone.read["packed"] == 0
    assert together == pytest.approx(apart, abs=1e-5)
    assert len(set(round(x, 4) for x in together)) > 2  # the thoughts moved q: a real check
    assert packed.read["positions"] < 0.5 * alone.read["positions"]
    rows = unpacked(prompts, replies, gold_index=gold, n_options=sizes)
    assert rows == pytest.approx(apart, abs=1e-5) and unpacked.read["packed"] == 0


def test_the_trainer_binds_its_policy_to_its_own_reward_instance(
    tiny_policy, small_clean, tmp_path
):
    from grail.train.trainer import BindPolicy, build_trainer

    argv = tiny_args(
        small_clean,
        tiny_policy,
        tmp_path / "out",
        "--max_train_rows",
        "8",
        "--reward_funcs",
        "log_score",
        "format",
        "--reward_weights",
        "1",
        "0.25",
    )
    trainer, _ = build_trainer(*parse_train_args(argv))
    reward = trainer.reward_funcs[0]
    assert isinstance(reward, LogScoreReward)
    assert trainer.reward_func_names[:2] == ["log_score", "format_reward"]
    binding = next(c for c in trainer.callback_handler.callbacks if isinstance(c, BindPolicy))
    binding.on_train_begin(
        trainer.args,
        trainer.state,
        trainer.control,
        model=trainer.model,
        processing_class=trainer.processing_class,
    )
    assert reward.policy is trainer.model and reward.tokenizer is trainer.processing_class
    again, _ = build_trainer(*parse_train_args(argv))
    assert again.reward_funcs[0] is not reward


def test_cloning_weighs_the_option_token_fully_and_the_format_lightly(
    tiny_policy, small_clean, tmp_path
):
    """Behaviour cloning's loss on a real collated batch, recomputed here by hand from the
    model's full logits: the person's option over the row's slate (a softmax over the option
    numbers 1..n) at weight 1; at sft_format_weight every other reply token over the whole
    vocabulary and, at the choice, the mass on the option numbers 1..9 as a set (not the
    chosen number's own share over the vocabulary, which would teach each number's frequency
    over all slate sizes); the prompt and the template's text after the end-of-turn token not at
    all; in evaluation the choice alone."""
    from trl import SFTConfig

    from grail.train.sft import BehaviourCloningTrainer, choice_examples

    argv = tiny_args(small_clean, tiny_policy, tmp_path / "out", "--sft_dataset", "choices")
    config, _ = parse_train_args(argv)
    examples, held_out, _ = choice_examples(config)
    args = SFTConfig(
        output_dir=str(tmp_path / "sft"),
        use_cpu=True,
        report_to="none",
        completion_only_loss=True,
        per_device_train_batch_size=4,
    )
    rows = examples.select(range(4))
    losses = {}
    for weight in (0.0, 0.5):
        trainer = BehaviourCloningTrainer(
            model=str(tiny_policy), args=args, train_dataset=rows, format_weight=weight
        )
        batch = next(iter(trainer.get_train_dataloader()))
        model = trainer.model
        model.train()
        losses[weight] = trainer.compute_loss(model, dict(batch)).item()
        model.eval()
        losses[f"eval {weight}"] = trainer.compute_loss(model, dict(batch)).item()
    tokenizer = trainer.processing_class
    assert batch["n_options"].tolist() == rows["n_options"]  # the slates travel with the batch
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    log_probs = logits[:, :-1].log_softmax(-1)
    targets = batch["labels"][:, 1:]
    digits = [tokenizer.convert_tokens_to_ids(str(k)) for k in range(1, 10)]
    choice, format_ = 0.0, 0.0
    for row in range(targets.shape[0]):
        ended = False
        for t, token in enumerate(targets[row].tolist()):
            if token == -100 or ended:
                continue
            if token in digits:
                shown = digits[: rows["n_options"][row]]
                slate = logits[row, t, shown].log_softmax(-1)
                choice += -slate[digits.index(token)].item()
                format_ += -log_probs[row, t, digits].logsumexp(-1).item()  # some number
            else:
                format_ += -log_probs[row, t, token].item()
            ended = token == tokenizer.eos_token_id
    count = targets.shape[0]
    assert losses[0.0] == pytest.approx(choice / count, rel=1e-4)
    assert losses[0.5] == pytest.approx((choice + 0.5 * format_) / count, rel=1e-4)
    assert losses["eval 0.5"] == pytest.approx(choice / count, rel=1e-4)
    decoded = [tokenizer.decode([t]) for t in targets[0].tolist() if t != -100]
    assert sum(d.strip().isdigit() for d in decoded) == 1  # one option token per reply


def test_cloning_holds_out_whole_participants(small_clean, tmp_path):
    from grail.tasks.slate.contract import read_dataset
    from grail.train.sft import choice_examples, held_out_participants

    argv = tiny_args(
        small_clean,
        "unused",
        tmp_path / "out",
        "--sft_dataset",
        "choices",
        "--sft_holdout_fraction",
        "0.25",
    )
    config, _ = parse_train_args(argv)
    train, held_out, _ = choice_examples(config)
    rows = read_dataset(small_clean, split="train").to_pylist()
    held = held_out_participants([r["participant_id"] for r in rows], 0.25, config.seed)
    assert 0 < len(held) < len({r["participant_id"] for r in rows})
    assert len(held_out) == sum(r["participant_id"] in held for r in rows)
    assert len(train) + len(held_out) == len(rows)  # every row is cloned or held out
    config.sft_holdout_fraction = 0.0
    assert choice_examples(config)[1] is None
    config.sft_max_train_rows = 5
    assert len(choice_examples(config)[0]) == 5


OLD_SMOLLM2 = [
    "--reward_funcs",
    "accuracy",
    "format",
    "--reward_weights",
    "1.0",
    "0.25",
    "--beta",
    "0.04",
]  # the SmolLM2 GRPO recipe before proper scoring rules


def test_the_collapse_guard_fires_on_the_old_smollm2_recipe(small_clean, tmp_path, caplog):
    from grail.tasks.slate.rewards import warn_mode_seeking
    from grail.train.examples import load_examples

    recipe = TINY_GRPO.parents[1] / "SmolLM2-135M-Instruct" / "config_grpo.yaml"
    config, _ = parse_train_args(
        tiny_args(small_clean, "unused", tmp_path / "o", *OLD_SMOLLM2, recipe=recipe)
    )
    examples = load_examples(config, "train", None)
    line = warn_mode_seeking(config, [0.8, 0.2], examples)
    assert "w/beta = 20" in line and "worse than uniform" in line and "\n" not in line
    assert line in caplog.text
    optimum, uniform = accuracy_optimum_log_loss(
        list(zip(examples["gold_index"], examples["n_options"], strict=True)), 20.0
    )
    assert optimum > uniform
    config.beta = 0.0  # no KL term at all: the optimum is the collapse itself
    assert "inf" in warn_mode_seeking(config, [0.8, 0.2], examples)


def slate_rl_recipes() -> list:
    """Every shipped recipe that trains slate choices with RL (the summarize task's and the
    cloning-only ones have no choice reward to collapse)."""
    import yaml

    found = []
    for recipe in sorted(TINY_GRPO.parents[1].glob("**/config_*.yaml")):
        values = yaml.safe_load(recipe.read_text())
        if values.get("task", "slate") == "slate" and values.get("rl", True):
            found.append(recipe)
    return found


def test_the_recipes_held_to_it_include_every_shipped_grpo_and_grail_recipe():
    names = {f"{r.parent.name}/{r.name}" for r in slate_rl_recipes()}
    assert {"tiny/config_grpo.yaml", "tiny/config_grail.yaml"} <= names
    assert {"SmolLM2-135M-Instruct/config_grpo.yaml", "grpo/config_grail_wage.yaml"} <= names


@pytest.mark.parametrize("recipe", slate_rl_recipes(), ids=lambda r: f"{r.parent.name}/{r.name}")
def test_no_shipped_recipe_pays_for_collapse(recipe, small_clean, tmp_path):
    from grail.tasks.slate.rewards import warn_mode_seeking
    from grail.train.examples import load_examples

    argv = [
        "--config",
        str(recipe),
        "--dataset",
        str(small_clean),
        "--output_dir",
        str(tmp_path / "o"),
        "--use_vllm",
        "false",
        "--bf16",
        "false",
        "--use_cpu",
        "true",
    ]
    config, _ = parse_train_args(argv)
    _, weights = resolve_rewards(config.reward_funcs, config.reward_weights, REWARDS)
    assert warn_mode_seeking(config, weights, load_examples(config, "train", None)) is None


def test_early_stopping_keeps_the_best_model_and_stops_after_patience(tmp_path):
    """KeepBest saves the model at each evaluation that lowers the held-out log-loss and stops
    training after `patience` evaluations without one; the saved model is the best one."""
    from types import SimpleNamespace

    from grail.train.sft import KeepBest

    saved = []
    keep = KeepBest(tmp_path, patience=2)
    keep.trainer = SimpleNamespace(save_model=lambda out: saved.append((out, state.global_step)))
    control = SimpleNamespace(should_training_stop=False)
    state = SimpleNamespace(global_step=0, max_steps=50)
    for step, loss in ((10, 1.30), (20, 1.27), (30, 1.28), (40, 1.26), (50, 1.29)):
        state.global_step = step
        keep.on_evaluate(None, state, control, metrics={"eval_loss": loss})
        assert control.should_training_stop is False
    assert [step for _, step in saved] == [10, 20, 40] and keep.step == 40 and keep.best == 1.26
    state.global_step = 60
    keep.on_evaluate(None, state, control, metrics={"eval_loss": 1.27})
    assert control.should_training_stop is True  # two evaluations in a row without a lower one
    keep.write(tmp_path, SimpleNamespace(global_step=60, max_steps=100), 800, 90)
    record = __import__("json").loads((tmp_path / "cloning.json").read_text())
    assert record["best_step"] == 40 and record["stopped_early"] is True


def test_a_warm_start_on_several_nodes_without_a_checkpoint_store_is_one_line(
    small_clean, tmp_path, monkeypatch
):
    """The cloned model is written on one node; the others get it through checkpoint_uri."""
    from grail.core.errors import GrailError
    from grail.train.sft import sft_warm_start

    monkeypatch.setenv("PET_NNODES", "2")
    config, model_config = parse_train_args(tiny_args(small_clean, "unused", tmp_path / "o"))
    with pytest.raises(GrailError, match="several nodes needs checkpoint_uri"):
        sft_warm_start(config, model_config)
