"""The offline tiny model: a Qwen2 causal LM and a tokenizer that reloads with the same ids."""

from __future__ import annotations

from transformers import AutoConfig, AutoTokenizer

from grail.contract import read_dataset
from grail.prompts import build_messages
from grail.tiny import conversations, corpus, train_tokenizer


def test_tokenizer_reloads_with_the_same_ids(tmp_path, small_clean):
    tokenizer = train_tokenizer(corpus(conversations(small_clean, limit=200)), vocab_size=800)
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    row = read_dataset(small_clean).slice(0, 1).to_pylist()[0]
    text = tokenizer.apply_chat_template(
        build_messages(row), tokenize=False, add_generation_prompt=True
    )
    text += "<think>café 🔥 “x”</think><answer>3</answer>"
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert reloaded.decode(reloaded(text)["input_ids"]) == text
    assert text.startswith("<|im_start|>system\n") and "<|im_start|>assistant\n" in text
    assert (reloaded.eos_token, reloaded.pad_token) == ("<|im_end|>", "<|endoftext|>")


def test_tiny_model_is_qwen2_with_matching_vocab(tiny_model, tiny_discriminator):
    config = AutoConfig.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert config.model_type == "qwen2" and config.hidden_size == 64
    assert config.vocab_size == len(tokenizer)
    assert config.eos_token_id == tokenizer.eos_token_id
    classifier = AutoConfig.from_pretrained(tiny_discriminator)
    assert classifier.architectures == ["Qwen2ForSequenceClassification"]
    assert classifier.num_labels == 1 and classifier.pad_token_id == tokenizer.pad_token_id


def test_the_command_shows_progress_on_stderr(tmp_path, small_clean, capsys):
    from grail.cli import main

    out = tmp_path / "m"
    args = ["tiny-model", "--out", str(out), "--data", str(small_clean), "--vocab-size", "600"]
    assert main([*args, "--format-warmup", "3"]) == 0
    err = capsys.readouterr().err
    assert "training a 600-token tokenizer on" in err
    assert "format warm-up steps: 0/3" in err and "format warm-up steps: 3/3" in err
    assert "saved the causal-lm model" in err and (out / "config.json").is_file()


def test_the_format_warm_up_teaches_the_tags_and_favours_no_option(tiny_model, small_clean):
    """After the warm-up (100 steps, as the embedded default), greedy replies carry the answer
    format, and no option number is favoured beyond the uniform share of its slate: what GRPO
    learns about positions comes from the rewards. (The number 5, trained only on the rare
    five-option slates, stays under-weighted there.)"""
    import numpy as np

    from grail.predict import answer_transformers
    from grail.rewards import format_reward

    rows = read_dataset(small_clean, split="validation").slice(0, 48).to_pylist()
    chats = [build_messages(row) for row in rows]
    answers = answer_transformers(str(tiny_model), chats, [r["n_options"] for r in rows], 16, 16)
    assert np.mean(format_reward(None, answers.completions)) > 0.9
    for size in {r["n_options"] for r in rows}:
        shares = np.mean([d for d in answers.distributions if len(d) == size], axis=0)
        assert shares.max() < 1 / size + 0.12, (size, shares.round(3))
        assert np.abs(shares[:4] - 1 / size).max() < 0.12, (size, shares.round(3))
