"""The offline tiny model: a Qwen2 causal LM and a tokenizer that reloads with the same ids."""

from __future__ import annotations

from transformers import AutoConfig, AutoTokenizer

from grail.tasks.slate.contract import read_dataset
from grail.tasks.slate.prompts import build_messages
from grail.tasks.slate.warmup import ANSWER_SAMPLES, conversations
from grail.train.tiny import corpus, train_tokenizer


def test_tokenizer_reloads_with_the_same_ids(tmp_path, small_clean):
    tokenizer = train_tokenizer(
        corpus(conversations(small_clean, limit=200), ANSWER_SAMPLES), vocab_size=800
    )
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


def test_tiny_model_is_qwen2_with_matching_vocab(tiny_policy, tiny_discriminator):
    config = AutoConfig.from_pretrained(tiny_policy)
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
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


def test_a_classifier_reuses_the_policy_s_tokenizer(tmp_path, tiny_policy, capsys):
    """--tokenizer: the discriminator gets the policy's tokenizer (no data, no training)."""
    from transformers import AutoConfig, AutoTokenizer

    from grail.cli import main

    out = tmp_path / "d"
    args = [
        "tiny-model",
        "--out",
        str(out),
        "--task",
        "classifier",
        "--tokenizer",
        str(tiny_policy),
    ]
    assert main(args) == 0
    assert "tokenizer on" not in capsys.readouterr().err  # nothing trained
    policy, reused = AutoTokenizer.from_pretrained(tiny_policy), AutoTokenizer.from_pretrained(out)
    assert reused.get_vocab() == policy.get_vocab() and reused.chat_template == policy.chat_template
    assert AutoConfig.from_pretrained(out).vocab_size == len(policy)


def test_the_format_warm_up_teaches_the_tags_and_favours_no_option(tiny_policy, small_clean):
    """After the warm-up (as the embedded default's), greedy replies carry the answer
    format, and no option number is favoured beyond the uniform share of its slate: what GRPO
    learns about positions comes from the rewards. (The number 5, trained only on the rare
    five-option slates, stays under-weighted there.)"""
    import numpy as np

    from grail.inference.local import answer_transformers
    from grail.tasks.slate.rewards import format_reward

    rows = read_dataset(small_clean, split="validation").slice(0, 48).to_pylist()
    chats = [build_messages(row) for row in rows]
    answers = answer_transformers(str(tiny_policy), chats, [r["n_options"] for r in rows], 16, 16)
    assert np.mean(format_reward(None, answers.completions)) > 0.9
    for size in {r["n_options"] for r in rows}:
        shares = np.mean([d for d in answers.distributions if len(d) == size], axis=0)
        assert shares.max() < 1 / size + 0.12, (size, shares.round(3))
        assert np.abs(shares[:4] - 1 / size).max() < 0.12, (size, shares.round(3))


def test_replies_sampled_after_the_warm_up_keep_the_format(tiny_policy, small_clean):
    """GRPO samples its completions at temperature 1 on the tiny recipe's prompts: after the
    warm-up nearly all of them keep the format, so the rewards vary with the option chosen
    rather than with broken tags (a warm-up at a constant rate left up to half of them broken)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from grail.core.recipes import read_recipe
    from grail.tasks.slate.prompts import PromptOptions
    from grail.tasks.slate.rewards import format_reward

    recipe = read_recipe("recipes/tiny/config_grpo.yaml")
    asked = PromptOptions(
        history_depth=recipe["history_depth"], system_prompt=recipe["system_prompt"]
    )
    rows = read_dataset(small_clean, split="train").slice(0, 64).to_pylist()
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(tiny_policy).eval()
    texts = [
        tokenizer.apply_chat_template(
            build_messages(row, asked), tokenize=False, add_generation_prompt=True
        )
        for row in rows
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    with torch.inference_mode():
        output = model.generate(
            **batch,
            max_new_tokens=recipe["max_completion_length"],
            do_sample=True,
            temperature=recipe["temperature"],
            top_p=1.0,
            pad_token_id=tokenizer.pad_token_id,
        )
    replies = tokenizer.batch_decode(
        output[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
    )
    assert np.mean(format_reward(None, replies)) >= 0.9, replies[:8]


def test_a_warm_up_toward_peoples_positions_gives_clear_preferences(small_clean, tmp_path):
    """`--warmup-target positions` (as the vLLM tier's model is built): the option number is
    trained toward how often people chose each display position, so option 1 leads by a clear
    margin; the head size follows --heads (64, vLLM's; one head of a 64-wide model, half the
    time of the vLLM tier's two of 128)."""
    import numpy as np

    from grail.inference.local import answer_transformers
    from grail.tasks.slate.warmup import position_frequencies
    from grail.train.tiny import build_tiny_model

    shares = position_frequencies(small_clean)
    assert all(abs(sum(s) - 1) < 1e-9 and s[0] == max(s) for n, s in shares.items() if n > 2)
    out = build_tiny_model(
        tmp_path / "m",
        data=small_clean,
        format_warmup=60,
        warmup_target="positions",
        hidden_size=64,
        heads=1,
    )
    config = AutoConfig.from_pretrained(out)
    assert config.hidden_size // config.num_attention_heads == 64
    rows = read_dataset(small_clean, split="validation").slice(0, 24).to_pylist()
    rows = [r for r in rows if r["n_options"] == 4]
    chats = [build_messages(row) for row in rows]
    answers = answer_transformers(str(out), chats, [4] * len(rows), 16, 16)
    mean = np.mean(answers.distributions, axis=0)
    assert mean[0] > mean[1] + 0.1, mean.round(3)


def test_bad_tiny_model_settings_are_refused(tmp_path):
    import pytest

    from grail.train.tiny import TinyModelConfig

    with pytest.raises(ValueError, match="--heads 3: must divide --hidden-size 64"):
        TinyModelConfig(out=str(tmp_path), heads=3)
    with pytest.raises(ValueError, match="--warmup-target positions needs --data"):
        TinyModelConfig(out=str(tmp_path), warmup_target="positions")


def test_the_warm_ups_loss_is_the_models_own_with_the_head_on_the_reply_alone(tiny_policy):
    """grail.core.warmup.reply_logits: the LM head applied where a label or a soft target
    is, giving the loss and logits the whole forward pass gives there."""
    import torch
    from transformers import AutoModelForCausalLM

    from grail.core.warmup import reply_logits

    model = AutoModelForCausalLM.from_pretrained(tiny_policy)
    torch.manual_seed(0)
    ids = torch.randint(model.config.vocab_size, (3, 30)).tolist()
    mask = [[1] * 30, [1] * 26 + [0] * 4, [1] * 21 + [0] * 9]  # right padding
    labels = [
        [-100] * 20 + row[20:end] + [-100] * (30 - end)
        for row, end in zip(ids, (30, 26, 21), strict=True)
    ]
    at = [24, 22, 18]
    loss, logits = reply_logits(model, ids, mask, labels, at)
    whole = model(
        input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), labels=torch.tensor(labels)
    )
    torch.testing.assert_close(loss, whole.loss)
    torch.testing.assert_close(logits, whole.logits[torch.arange(3), torch.tensor(at)])


def test_a_right_padded_batch_runs_on_causal_attention_alone_with_the_masks_gradients(tiny_policy):
    """grail.core.padding.causal_attention_mask: the warm-up's right-padded rows run without
    the L x L mask (the real tokens' hidden states and every gradient as with it); a row with
    a pad before a token (left padding) keeps its mask."""
    import torch
    from transformers import AutoModelForCausalLM

    from grail.core.padding import causal_attention_mask
    from grail.core.warmup import reply_logits

    model = AutoModelForCausalLM.from_pretrained(tiny_policy)
    torch.manual_seed(0)
    ids = torch.randint(model.config.vocab_size, (3, 30)).tolist()
    mask = [[1] * 30, [1] * 26 + [0] * 4, [1] * 21 + [0] * 9]
    labels = [
        [-100] * 20 + row[20:end] + [-100] * (30 - end)
        for row, end in zip(ids, (30, 26, 21), strict=True)
    ]
    assert causal_attention_mask(torch.tensor(mask)) is None
    left = torch.tensor([list(reversed(row)) for row in mask])
    assert causal_attention_mask(left) is left
    loss, _ = reply_logits(model, ids, mask, labels, [24, 22, 18])
    loss.backward()
    causal = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(
        input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), labels=torch.tensor(labels)
    ).loss.backward()
    for alone, masked in zip(causal, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(alone, masked)
