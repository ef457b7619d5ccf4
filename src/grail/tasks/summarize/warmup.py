"""The summarize task's tiny-model warm-up (:mod:`grail.train.tiny`): conversations whose
replies keep the budget's number of random distinct sentences, teacher-forced whole
(:func:`grail.core.warmup.teach_replies`)."""

from __future__ import annotations

from pathlib import Path

from grail.core.warmup import teach_replies

ANSWER_SAMPLES: list[str] = []  # every conversation carries its own <keep> reply
TARGETS = ("uniform",)  # random sentences kept: no preference to train toward
STEPS = 300  # the tiny summarizer's warm-up: its replies keep the <keep></keep> format


def conversations(data: str | Path, limit: int = 3000) -> list[list[dict[str, str]]]:
    """The summarize task's prompts (extractive, the default budget), each with a reply that
    keeps exactly the budget's number of its sentences (all of a shorter document), drawn at
    random: the format and a full budget, and no preference for any sentence. (It kept a random
    6 to 12, so step 0 started below random-12.)"""
    import numpy as np

    from grail.tasks.summarize.clean import read_documents
    from grail.tasks.summarize.prompt import BUDGETS, build_messages, extractive_reply

    rng = np.random.default_rng(0)
    chats = []
    for doc in read_documents(data, "train", limit):
        n, budget = len(doc["sentences"]), BUDGETS["extractive"]
        kept = sorted(rng.choice(n, min(n, budget), replace=False).tolist())
        reply = {"role": "assistant", "content": extractive_reply(kept)}
        chats.append(
            build_messages(doc["sentences"], "extractive", BUDGETS["extractive"]) + [reply]
        )
    return chats


def warm_up(
    model, tokenizer, chats: list[list[dict[str, str]]], steps: int, seed: int,
    data: str | Path | None, target: str, prompt_weight: float = 0.0,
) -> list[float]:  # fmt: skip
    """The summarize task's format warm-up: each reply teacher-forced whole
    (:func:`grail.core.warmup.teach_replies`; `data` and `target` are the slate task's), the
    documents read as a language model at `prompt_weight`."""
    return teach_replies(model, tokenizer, chats, steps, seed, prompt_weight=prompt_weight)
