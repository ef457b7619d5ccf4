"""Replies sampled from a model with transformers' ``generate``, outside TRL's generation: what
the GAIL discriminator is pre-trained against (the start model's own choices) and the thoughts
behaviour cloning keeps (``sft_thoughts: own``).
"""

from __future__ import annotations

import torch


def sample_replies(
    model,
    tokenizer,
    prompts: list,
    max_new_tokens: int,
    temperature: float,
    batch: int,
    what: str = "sampled replies",
) -> list[str]:
    """One sampled reply per prompt from `model`, `batch` prompts at a time (under ZeRO-3
    transformers' generate keeps the ranks' forwards in step, ``synced_gpus``); a progress
    line names `what` (minutes on a CPU)."""
    from grail.core.progress import Progress

    texts = [
        p
        if isinstance(p, str)
        else tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    device = next(model.parameters()).device
    training, replies = model.training, []
    progress = Progress(what, len(texts))
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(texts), batch):
                inputs = tokenizer(
                    texts[start : start + batch],
                    return_tensors="pt",
                    padding=True,
                    padding_side="left",
                    add_special_tokens=False,
                ).to(device)
                out = model.generate(
                    **inputs,
                    do_sample=True,
                    temperature=temperature,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                )
                replies += tokenizer.batch_decode(
                    out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True
                )
                progress.update(len(replies))
    finally:
        model.train(training)
    return replies
