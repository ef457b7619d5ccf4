"""What every task's format warm-up of a tiny model shares (:mod:`grail.train.tiny`): an AdamW
whose rate decays to 0, a clipped step, the causal LM's loss on the reply with the LM head
applied where it is needed, and the plain teacher-forced loop over whole replies."""

from __future__ import annotations

from grail.core.progress import Progress


def teach_replies(
    model, tokenizer, chats: list[list[dict[str, str]]], steps: int, seed: int = 0,
    batch_size: int = 8, lr: float = 6e-3, prompt_weight: float = 0.0,
) -> list[float]:  # fmt: skip
    """Teacher-force each conversation's reply (the loss on the reply only; with
    `prompt_weight`, plus the prompt read as a language model) for a few steps, with the rate
    decaying to 0 (the summarize task's format warm-up, whose replies keep random sentences,
    so the model learns the format and no preference). Returns the losses."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    optimizer, schedule = warmup_optimizer(model, lr, steps)
    pad, losses = tokenizer.pad_token_id, []
    progress = Progress("format warm-up steps", steps)
    model.train()
    for _ in range(steps):
        picks = torch.randint(len(chats), (batch_size,), generator=generator).tolist()
        pairs = []
        for i in picks:
            text = tokenizer.apply_chat_template(
                chats[i][:-1], tokenize=False, add_generation_prompt=True
            )
            prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
            reply = tokenizer(chats[i][-1]["content"] + "<|im_end|>", add_special_tokens=False)
            pairs.append((prompt, reply["input_ids"]))
        width = max(len(p) + len(r) for p, r in pairs)
        ids = [p + r + [pad] * (width - len(p) - len(r)) for p, r in pairs]
        labels = [[-100] * len(p) + r + [-100] * (width - len(p) - len(r)) for p, r in pairs]
        mask = [[1] * (len(p) + len(r)) + [0] * (width - len(p) - len(r)) for p, r in pairs]
        loss, _ = reply_logits(model, ids, mask, labels, [0] * len(pairs), prompt_weight)
        losses.append(take_step(loss, model, optimizer, schedule))
        progress.update(len(losses), f"loss {losses[-1]:.3f}")
    model.eval()
    return losses


def warmup_optimizer(model, lr: float, steps: int):
    """AdamW at `lr`, decaying linearly to 0 over `steps`: a warm-up that ends gently."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)


def take_step(loss, model, optimizer, schedule) -> float:
    """One warm-up step with the gradient norm clipped to 1; returns the loss."""
    import torch

    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    return loss.item()


def reply_logits(model, ids, mask, labels, at, prompt_weight: float = 0.0):
    """The causal LM's loss on the labelled tokens (mean cross-entropy of each next token, as
    ``model(labels=...)`` computes it) and its logits at the positions `at`, with the LM head
    applied at those positions alone: a prompt is ~20 times longer than its reply, and the
    head over every prompt position made a warm-up step half as long again. With
    `prompt_weight`, plus that times the same loss on every other real token (the prompt's own
    text, read as a language model reads it: the slate task's warm-up). A right-padded batch
    runs on causal attention alone (:func:`grail.core.padding.causal_attention_mask`)."""
    import torch

    from grail.core.padding import causal_attention_mask

    ids, mask = torch.tensor(ids), torch.tensor(mask)
    hidden = model.model(
        input_ids=ids, attention_mask=causal_attention_mask(mask)
    ).last_hidden_state
    following = torch.tensor(labels)[:, 1:]  # the token each position predicts
    scored = following != -100
    loss = torch.nn.functional.cross_entropy(
        model.lm_head(hidden[:, :-1][scored]), following[scored]
    )
    if prompt_weight:
        text = (mask[:, 1:] == 1) & ~scored
        loss = loss + prompt_weight * torch.nn.functional.cross_entropy(
            model.lm_head(hidden[:, :-1][text]), ids[:, 1:][text]
        )
    return loss, model.lm_head(hidden[torch.arange(len(at)), torch.tensor(at)])
