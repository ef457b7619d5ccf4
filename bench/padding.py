"""Benchmark causal attention alone against the padding mask on right-padded batches: one
training step of the tiny policy (the cloning's shape: 64 rows of the simulated study's
prompts, right padded as TRL's collator pads them, the LM head at the positions after the
prompt, AdamW) with the batch's attention mask and without it
(:func:`grail.core.padding.causal_attention_mask`), and how far their outputs and gradients
are apart.

Why: the cloning and the format warm-up of the tiny-models task run right-padded batches,
where no real token attends to a pad. With a mask PyTorch's SDPA applies the whole L x L mask;
without one it runs causal (``is_causal``) and skips the upper triangle
(docs/development.md#the-demo).

Run: ``.venv/bin/python bench/padding.py [--steps 5] [--threads 2]``. Prints a Markdown table;
each figure is the median step after one warm-up step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

ROWS = 64  # the demo's cloning batch


def right_padded_batch(model_path: str, clean: Path):
    """(ids, mask, last): the first ROWS prompts of the cleaned study, tokenized with the chat
    template, right padded; `last`: each row's last real position."""
    import torch
    from transformers import AutoTokenizer

    from grail.tasks import TASKS

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    chats = TASKS["slate"].warmup_conversations(str(clean))[:ROWS]
    texts = [
        tokenizer.apply_chat_template(chat[:-1], add_generation_prompt=True, tokenize=False)
        for chat in chats
    ]
    rows = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    width = max(len(row) for row in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    return ids, mask, torch.tensor([len(row) - 1 for row in rows])


def timed_steps(model_path: str, batch, use_mask: bool, count: int):
    """(seconds of each of `count` steps after a warm-up one, the last step's hidden states at
    the real tokens, its gradients)."""
    import torch
    from transformers import AutoModelForCausalLM

    from grail.core.padding import causal_attention_mask

    ids, mask, last = batch
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    given = mask if use_mask else causal_attention_mask(mask)
    assert use_mask or given is None, "the bench's batch is right padded"
    seconds = []
    for _ in range(count + 1):
        model.zero_grad()
        started = time.perf_counter()
        hidden = model.model(input_ids=ids, attention_mask=given).last_hidden_state
        logits = model.lm_head(hidden[torch.arange(ROWS), last])
        logits.float().logsumexp(-1).mean().backward()
        seconds.append(time.perf_counter() - started)
    grads = [p.grad.clone() for p in model.parameters()]
    return seconds[1:], hidden.detach()[mask.bool()], grads


def main() -> None:
    import torch

    from grail.clean.stage import clean
    from grail.tasks.slate.simulate import simulate
    from grail.train.tiny import build_tiny_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per setting")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the task's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="grail-bench-padding-") as tmp:
        simulate(Path(tmp) / "raw", participants=240, seed=11)
        clean(Path(tmp) / "raw", Path(tmp) / "clean")
        model = str(build_tiny_model(Path(tmp) / "policy", data=Path(tmp) / "clean"))
        batch = right_padded_batch(model, Path(tmp) / "clean")
        masked, hidden_masked, grads_masked = timed_steps(model, batch, True, args.steps)
        causal, hidden_causal, grads_causal = timed_steps(model, batch, False, args.steps)
    ids, mask, _ = batch
    real = mask.float().mean().item()
    hidden_gap = (hidden_causal - hidden_masked).abs().max().item()
    grad_gap = max(
        (a - b).abs().max().item() for a, b in zip(grads_causal, grads_masked, strict=True)
    )
    grad_scale = max(g.abs().max().item() for g in grads_masked)
    one, two = statistics.median(masked), statistics.median(causal)
    print(
        f"tiny policy, {ROWS} rows x {ids.shape[1]} tokens ({real:.0%} real), {args.threads} "
        f"threads, median of {args.steps} steps\n"
    )
    print("| attention | seconds per step | against the mask |")
    print("|---|---:|---:|")
    print(f"| the padding mask (L x L) | {one:.3f} | 1.00 |")
    print(f"| causal alone | {two:.3f} | {one / two:.2f} |")
    print(
        f"\nlargest gap at the real tokens: hidden states {hidden_gap:.3g}; gradients "
        f"{grad_gap:.3g} (largest gradient {grad_scale:.3g})"
    )


if __name__ == "__main__":
    main()
