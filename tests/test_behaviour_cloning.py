"""Behaviour cloning: the SFT warm start on the train split's own choices (``sft_dataset:
choices``), with no model server: each train prompt, as GRPO sees it, with the reply that picks
the option the person chose; the loss on that reply only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_settings import TINY_GRPO, tiny_args

from grail.core.errors import GrailError
from grail.tasks.slate.rewards import format_reward, parse_answer
from grail.train.config import parse_train_args


def test_each_train_prompt_gets_the_reply_that_picks_the_persons_choice(tmp_path, small_clean):
    from grail.tasks.slate.contract import read_dataset
    from grail.train.examples import load_examples
    from grail.train.sft import choice_examples

    argv = tiny_args(small_clean, "unused", tmp_path / "out", "--sft_dataset", "choices")
    argv += ["--sft_holdout_fraction", "0"]  # every train row cloned
    config, _ = parse_train_args([*argv, "--issues", "gun_control", "--shuffle_seed", "5"])
    examples, held_out, thoughts = choice_examples(config)
    assert held_out is None and thoughts is None  # sft_thoughts: empty
    prompts = load_examples(config, "train", None)  # what GRPO trains on, shuffled alike
    train = [
        r
        for r in read_dataset(small_clean, split="train").to_pylist()
        if r["issue"] == "gun_control"
    ]
    assert len(examples) == len(prompts) == len(train) > 0
    for example, prompt in zip(examples, prompts, strict=True):
        assert example["prompt"] == prompt["prompt"]
        (reply,) = example["completion"]
        assert reply["role"] == "assistant"
        assert format_reward(None, [reply["content"]]) == [1.0]
        assert parse_answer(reply["content"], prompt["n_options"]) == prompt["gold_index"]
        assert example["n_options"] == prompt["n_options"]  # the slate the choice is over
    # shuffled slates: the reply follows the option to where it is shown, not where it was
    moved = [p["gold_index"] != r["gold_index"] for p, r in zip(prompts, train, strict=True)]
    assert any(moved) and not all(moved)


def test_with_the_opinion_task_the_reply_states_the_opinion(tmp_path, small_clean):
    from grail.train.sft import choice_examples

    argv = tiny_args(small_clean, "unused", tmp_path / "out", "--sft_dataset", "choices")
    config, _ = parse_train_args([*argv, "--opinion", "true"])
    replies = [e["completion"][0]["content"] for e in choice_examples(config)[0]]
    assert any("<opinion>" in r for r in replies)
    assert format_reward(None, replies) == [1.0] * len(replies)


def test_own_thoughts_are_kept_and_carry_no_loss(tmp_path, small_clean, tiny_policy, monkeypatch):
    """sft_thoughts: own: each cloned reply keeps a thought the start model sampled for that
    prompt (the tiny policy, warmed up on empty thoughts, samples mostly empty ones: counted);
    TRL's completion mask (the labels) covers the answer alone, never a token of the thought
    nor its </think> (where a thought ends is the thought's: shown with thoughts a sampler
    wrote, ending in ">" as a tag would, which merges with a following "<" unless a line
    break parts them)."""
    import grail.train.sampling
    from grail.train.sft import BehaviourCloningTrainer, choice_examples, sft_config

    argv = tiny_args(small_clean, tiny_policy, tmp_path / "out", "--sft_thoughts", "own")
    argv += ["--sft_max_train_rows", "24", "--max_completion_length", "48"]
    config, model_config = parse_train_args(argv)
    examples, held_out, stats = choice_examples(config, model_config)
    sampled = json.loads((tmp_path / "out" / "sft" / "thoughts.json").read_text())
    assert len(sampled) == 24 == len(examples) + len(held_out)
    assert stats["source"] == "own" and stats["rows"] == 24
    assert stats["non_empty_share"] == sum(map(bool, sampled)) / 24
    asked = []

    def sampler(model, tokenizer, texts, *_):
        asked.extend(texts)
        return [f" viewer {k} leans <pro> </think><answer>1</answer>" for k in range(len(texts))]

    monkeypatch.setattr(grail.train.sampling, "sample_replies", sampler)
    config.output_dir = str(tmp_path / "again")
    examples, held_out, stats = choice_examples(config, model_config)
    assert all(text.endswith("<|im_start|>assistant\n<think>") for text in asked)
    assert stats["non_empty_share"] == 1.0
    # each row's prompt, then its own sampled thought: no thought lost or moved
    closed = {text + f"viewer {k} leans <pro>\n</think>\n" for k, text in enumerate(asked)}
    assert set(examples["prompt"]) | set(held_out["prompt"]) == closed
    assert all(e["completion"].startswith("<answer>") for e in examples)  # the answer alone
    args = sft_config(config, model_config, tmp_path / "bc", len(examples), False)
    trainer = BehaviourCloningTrainer(model=str(tiny_policy), args=args, train_dataset=examples)
    tokenizer = trainer.processing_class
    for row, example in zip(trainer.train_dataset, examples, strict=True):
        labels = row["labels"]  # what the loss reads: -100 where it reads nothing
        scored = [t for t in labels if t != -100]
        assert tokenizer.decode(scored) == example["completion"] + tokenizer.eos_token
        unscored = [t for t, label in zip(row["input_ids"], labels, strict=True) if label == -100]
        assert tokenizer.decode(unscored).endswith(
            "<think>" + example["prompt"].rsplit("<think>", 1)[1]
        )


def test_an_empty_own_thought_is_drawn_again(tmp_path, small_clean, tiny_policy, monkeypatch):
    """A recipe that keeps thoughts clones a model that thinks: an empty own thought is drawn
    again (at most THOUGHT_REDRAWS times), the others are kept as first drawn."""
    import grail.train.sampling
    from grail.train.sft import THOUGHT_REDRAWS, choice_examples

    argv = tiny_args(small_clean, tiny_policy, tmp_path / "out", "--sft_thoughts", "own")
    argv += ["--sft_max_train_rows", "6", "--sft_holdout_fraction", "0"]
    argv += ["--max_completion_length", "48"]  # room for each thought whole
    config, model_config = parse_train_args(argv)
    draws = []

    def sampler(model, tokenizer, texts, *_):
        draws.append(len(texts))
        if len(draws) == 1:  # rows 0, 2, 4 write a thought, the others close it at once
            return [f" row {k} </think>" if k % 2 == 0 else "</think>" for k in range(len(texts))]
        if len(draws) == 2:  # one of the three redrawn writes one
            return [" late </think>", "</think>", ""]
        return ["</think>"] * len(texts)

    monkeypatch.setattr(grail.train.sampling, "sample_replies", sampler)
    examples, _, stats = choice_examples(config, model_config)
    assert draws == [6, 3, 2] and THOUGHT_REDRAWS == 2
    thoughts = json.loads((tmp_path / "out" / "sft" / "thoughts.json").read_text())
    assert thoughts == ["row 0", "late", "row 2", "", "row 4", ""]
    assert stats["non_empty_share"] == round(4 / 6, 4)


def test_sft_thought_sentences_keeps_each_thoughts_first_sentences(
    tmp_path, small_clean, tiny_policy, monkeypatch
):
    """sft_thought_sentences: 1 keeps each sampled thought's first sentence (ended by . ! ?
    or a line break), a prefix of what the model wrote; it needs thoughts, and 1 or more."""
    import grail.train.sampling
    from grail.train.sft import choice_examples

    argv = tiny_args(small_clean, tiny_policy, tmp_path / "out", "--sft_thoughts", "own")
    argv += ["--sft_max_train_rows", "4", "--sft_holdout_fraction", "0"]
    argv += ["--max_completion_length", "48", "--sft_thought_sentences", "1"]
    config, model_config = parse_train_args(argv)
    replies = [" Leans left. Picks 2.</think>", " OPTIONS:\n1. a</think>",
               " Why? No idea</think>", " a 2.5 hour talk</think>"]  # fmt: skip
    monkeypatch.setattr(grail.train.sampling, "sample_replies", lambda *_: replies)
    choice_examples(config, model_config)
    thoughts = json.loads((tmp_path / "out" / "sft" / "thoughts.json").read_text())
    assert thoughts == ["Leans left.", "OPTIONS:", "Why?", "a 2.5 hour talk"]
    for wrong in (["--sft_thought_sentences", "0"], ["--sft_thoughts", "empty"]):
        with pytest.raises(GrailError, match="sft_thought_sentences: 1 or more, with sft_thou"):
            parse_train_args([*argv, *wrong])


@pytest.mark.integration
def test_a_model_cloned_with_thoughts_opens_its_thought_for_every_reader(
    tmp_path, small_clean, tiny_policy
):
    """Cloning with thoughts puts no loss on ``<think>`` (it sits in the prompt), so the cloned
    model would never learn to open one (SmolLM2 stopped thinking: docs/results.md). The
    cloned model's chat template opens it: its generation prompt ends with ``<think>``, the
    template is otherwise the start model's, and the rewards read a reply that starts inside
    the thought as a whole one."""
    from transformers import AutoTokenizer

    from grail.core.rewards import opened
    from grail.tasks.slate.rewards import format_reward, tag_count_reward
    from grail.train.sft import prefill_thought, sft_warm_start

    argv = tiny_args(small_clean, tiny_policy, tmp_path / "out", "--sft_thoughts", "own")
    argv += ["--sft_max_train_rows", "12", "--sft_max_steps", "1", "--rl", "false"]
    argv += ["--max_completion_length", "16"]
    folder = sft_warm_start(*parse_train_args(argv))
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    cloned = AutoTokenizer.from_pretrained(folder)
    start = AutoTokenizer.from_pretrained(tiny_policy)
    asked = cloned.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    before = start.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert asked == before + "<think>" and not before.endswith("<think>")
    whole = cloned.apply_chat_template(chat, tokenize=False)  # a finished chat: unchanged
    assert whole == start.apply_chat_template(chat, tokenize=False)
    assert prefill_thought(cloned).chat_template == cloned.chat_template  # opened once
    reply = " leans pro-gun </think><answer>1</answer>"
    assert format_reward(None, [reply], n_options=[3]) == [1.0]
    assert tag_count_reward(None, [reply]) == [1.0] and opened(reply).startswith("<think>")


@pytest.mark.integration
def test_behaviour_cloning_then_grpo_starts_from_the_cloned_model(
    tmp_path, tiny_policy, small_clean
):
    """A real cloning run (2 epochs over the train split, batches of 16, evaluated each epoch
    on the held-out participants) ends with a held-out choice log-loss below a uniform guess
    over each slate (the tiny start answers at chance), saves its best model with cloning.json,
    then GRPO from it: the cloned model is the run's step 0, the one the benchmark scores GRPO
    against."""
    import math

    from grail.train.sft import choice_examples
    from grail.train.stage import run

    argv = tiny_args(small_clean, tiny_policy, tmp_path / "out", "--max_steps", 2)
    argv += ["--sft_max_steps", "-1", "--sft_num_train_epochs", "2"]
    argv += ["--per_device_train_batch_size", "16", "--sft_learning_rate", "3e-3"]
    config, model_config = parse_train_args(argv)
    _, held_out, _ = choice_examples(config)
    uniform = sum(math.log(n) for n in held_out["n_options"]) / len(held_out)
    summary = run(config, model_config)
    sft = tmp_path / "out" / "sft"
    record = json.loads((sft / "cloning.json").read_text())
    evaluated = [
        r["eval_loss"] for r in json.loads((sft / "metrics.json").read_text()) if "eval_loss" in r
    ]
    assert len(evaluated) == 2 and record["best_held_out_choice_log_loss"] == min(evaluated)
    assert record["best_held_out_choice_log_loss"] < uniform - 0.01, (record, uniform)
    assert record["held_out_rows"] == len(held_out) and (sft / "prompt.json").is_file()
    assert not list(sft.glob("checkpoint-*"))  # the best model is the folder itself
    assert summary["global_step"] == 2
    assert Path(summary["start_model"]).resolve() == sft.resolve() == Path(summary["sft_model"])


def test_rl_false_without_a_warm_start_is_one_line(tmp_path, small_clean):
    from grail.core.errors import GrailError

    argv = tiny_args(small_clean, "unused", tmp_path / "out", "--rl", "false", "--sft_dataset", "")
    with pytest.raises(GrailError, match="rl: false trains nothing without sft_dataset"):
        parse_train_args(argv)


@pytest.mark.integration
def test_the_bc_recipe_leaves_the_cloned_model_as_a_training_output(
    tmp_path, tiny_policy, small_clean
):
    """rl: false (recipes/tiny/config_bc.yaml): no GRPO step; the cloned model, its metrics
    and prompt in output_dir, its SFT steps as the last step, and the model it started from as
    step 0: what the benchmark scores as the series bc@step-0 .. bc@final."""
    from grail.inference.specs import expand_spec
    from grail.train.stage import run

    recipe = TINY_GRPO.with_name("config_bc.yaml")
    out = tmp_path / "out"
    argv = tiny_args(small_clean, tiny_policy, out, "--sft_max_steps", 2, recipe=recipe)
    summary = run(*parse_train_args(argv))
    assert summary["global_step"] == 2 and summary["reward_funcs"] == []
    assert Path(summary["start_model"]) == Path(tiny_policy).resolve()
    for name in ("model.safetensors", "metrics.json", "prompt.json", "summary.json"):
        assert (out / name).is_file(), name
    assert not list(out.glob("checkpoint-*"))
    specs = expand_spec(str(out), tmp_path / "dl")
    assert [(s.step, Path(s.path).resolve()) for s in specs] == [
        (0, Path(tiny_policy).resolve()),
        (2, out.resolve()),
    ]


@pytest.mark.integration
def test_option_scores_train_beside_the_choice_and_are_logged(tmp_path, tiny_policy, small_clean):
    """sft_option_score_weight: each step's loss adds the option scores' cross-entropy (where
    each option line ends), logged as option_score_nll beside choice_nll: a slate's scores
    start near uniform (log of its size, 4-5 options) and the loss is their weighted sum."""
    import math

    from grail.train.sft import sft_warm_start

    recipe = TINY_GRPO.with_name("config_bc.yaml")
    out = tmp_path / "out"
    argv = tiny_args(small_clean, tiny_policy, out, "--sft_max_steps", 3, recipe=recipe)
    argv += ["--sft_option_score_weight", "0.5", "--sft_format_weight", "0"]
    model = Path(sft_warm_start(*parse_train_args(argv)))
    logged = [m for m in json.loads((model / "metrics.json").read_text()) if "loss" in m]
    assert len(logged) == 3
    for step in logged:
        assert math.log(2) < step["option_score_nll"] < math.log(8)
        assert step["loss"] == pytest.approx(
            step["choice_nll"] + 0.5 * step["option_score_nll"], rel=1e-4
        )


def test_teacher_thoughts_come_from_a_generate_output_matched_by_session_and_step(tmp_path):
    """sft_thoughts: teacher: each row's thought is the first teacher reply that picked the
    person's choice, else the first reply; a row the teacher never answered keeps none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from grail.train.sft import teacher_thoughts

    replies = [  # (session, step, generation, completion, parsed, gold)
        ("s1", 0, 0, "<think>wrong idea</think><answer>2</answer>", 2, 1),
        ("s1", 0, 1, "<think>likes option one</think><answer>1</answer>", 1, 1),
        ("s1", 1, 0, "<think>only try</think><answer>3</answer>", 3, 2),
    ]
    names = ["session_id", "step_index", "generation_index", "completion", "parsed_answer"]
    table = pa.Table.from_pylist(
        [dict(zip([*names, "gold_index"], r, strict=True)) for r in replies]
    )
    pq.write_table(table, tmp_path / "generated.parquet")
    rows = [{"session_id": "s1", "step_index": k} for k in (0, 1, 2)]
    assert teacher_thoughts(str(tmp_path), rows) == ["likes option one", "only try", ""]
    from grail.core.errors import GrailError

    with pytest.raises(GrailError, match="sft_teacher: .*missing: no generated.parquet"):
        teacher_thoughts(str(tmp_path / "missing"), rows)


def test_a_cloned_thought_leaves_room_for_the_answer_in_rl_s_completions():
    """Own thoughts were sampled to the whole max_completion_length and cloned whole, so a
    cloned reply (thought, then answer) could exceed what RL's completions hold. A cloned
    thought takes what the answer leaves: max_completion_length less
    ``\n</think>\n<answer>NN</answer>`` and the end of turn."""
    from types import SimpleNamespace

    from grail.train.sft import fitted, thought_budget

    class Characters:  # a token per character
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}

        def decode(self, ids, skip_special_tokens=True):
            return "".join(map(chr, ids))

    chars = Characters()
    closing = len("\n</think>\n<answer>99</answer>") + 1
    plain = SimpleNamespace(task="slate", max_completion_length=40, opinion=False)
    assert thought_budget(plain, chars) == 40 - closing
    opinion = SimpleNamespace(task="slate", max_completion_length=80, opinion=True)
    assert thought_budget(opinion, chars) == 80 - closing - len("<opinion>increase</opinion>")
    assert fitted("a viewer who leans left", chars, 12) == "a viewer who"  # a word boundary
    assert fitted("a viewer who leans left", chars, 10) == "a viewer"  # no halved word
    assert fitted("short", chars, 12) == "short" and fitted(None, chars, 12) is None


@pytest.mark.parametrize("checkpointing", ["true", "false"])
def test_the_warm_start_recomputes_activations_only_where_the_recipe_says(tmp_path, checkpointing):
    """TRL's SFTConfig turns gradient checkpointing on by default; the warm start takes the
    recipe's ``gradient_checkpointing`` (or the memory estimate's) instead, so a tiny model on
    CPU does not recompute every forward (a fifth of the demo's cloning)."""
    from grail.train.sft import sft_config

    argv = tiny_args(tmp_path, "unused", tmp_path / "out", "--sft_dataset", "choices")
    config, model_config = parse_train_args([*argv, "--gradient_checkpointing", checkpointing])
    args = sft_config(config, model_config, tmp_path / "bc", 8, False)
    assert args.gradient_checkpointing is (checkpointing == "true")


@pytest.mark.integration
def test_a_warm_start_made_alike_is_adopted_and_one_made_otherwise_is_not(
    tmp_path, tiny_policy, small_clean, caplog
):
    """``sft_reuse`` (what the DAG's tiny-models task hands every branch of the embedded
    default): a warm start whose settings, examples and start model are this run's is copied,
    not cloned again; one cloned at another learning rate, or whose weights changed since it
    was made, is not adopted, and the line says what differs."""
    import logging

    from grail.train.sft import MADE_FROM, sft_warm_start

    def warm_start(out, *more):
        argv = tiny_args(small_clean, tiny_policy, tmp_path / out, "--max_steps", 1)
        config, model_config = parse_train_args([*argv, "--sft_max_steps", "2", *more])
        with caplog.at_level(logging.INFO, logger="grail.train.sft"):
            return Path(sft_warm_start(config, model_config))

    made = warm_start("first")
    assert json.loads((made / MADE_FROM).read_text())["start_model"]
    caplog.clear()
    adopted = warm_start("second", "--sft_reuse", str(made))
    assert "SFT warm start adopted from" in caplog.text and "SFT warm-start:" not in caplog.text
    weights = "model.safetensors"
    assert (adopted / weights).read_bytes() == (made / weights).read_bytes()
    assert (adopted / MADE_FROM).read_text() == (made / MADE_FROM).read_text()
    caplog.clear()
    other = warm_start("third", "--sft_reuse", str(made), "--sft_learning_rate", "5e-3")
    assert "not adopted (its sft differ): cloning" in caplog.text
    assert "SFT warm-start:" in caplog.text  # its steps, cloned here
    assert (other / weights).read_bytes() != (made / weights).read_bytes()
    # the probe: a byte of its weights flipped since it was made, the record kept
    data = bytearray((made / weights).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (made / weights).write_bytes(bytes(data))
    caplog.clear()
    fourth = warm_start("fourth", "--sft_reuse", str(made))
    assert "not adopted (its files are not those it was made with" in caplog.text
    assert (fourth / weights).read_bytes() == (adopted / weights).read_bytes()  # cloned alike
