"""Can the tiny summarizer's architecture learn to pick sentences by what they say at all?

A supervised check, the strongest signal there is: the demo's tiny summarizer (its 300-step
format warm-up) is teacher-forced on replies that keep sentences by a rule of their content, then
asked (greedy) on the demo study's 91 validation documents. If it cannot learn the rule this way,
no reward will teach it in the demo's 60 GRPO steps. Printed every quarter of the steps:

- the share of questions grail's reader answers from the greedy replies;
- what the kept sentences are: about the subject (``s``), about another entity (``d``), fluff
  (``f``: the study's fixed sentences with no fact);
- the probability the model puts on each kind at the reply's first id (``<keep>[``): a model
  that reads sentences moves mass off fluff; one that does not keeps it near the kind's share of
  the document's sentences (read it with ``--order random``: sorted replies and ``decide``
  replies start at ``[a]``).

Rules (``--target``): ``subject`` keeps the sentences naming the subject (the oracle: every
answerable question answered); ``not_fluff`` keeps 12 of the sentences that are not fluff, the
simplest rule of content there is (fluff is the same 12 sentences in every document). Replies
(``--format``): ``keep`` lists ids (``--order sorted`` as the demo's replies, or ``random``, a set
with no order to learn); ``decide`` writes every id with ``+`` or ``-`` after it, so each decision
follows its own id. ``--window N`` makes the first layer attend to the last N tokens only (its
sliding window, from the warm-up on), so the id after a sentence holds that
sentence's words; ``--copy-head C`` sets the last layer's first head to copy the ids it attends
to (value and output projections onto the ids' top embedding directions, times C), so only where
to attend is left to learn.

Run: ``.venv/bin/python bench/summarize_supervised.py [--target not_fluff --order random
--window 16] [--steps 600] [--documents 3000]`` (about 2 minutes per 600 steps on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

from grail.clean.config import CleanConfig
from grail.core.warmup import teach_replies
from grail.tasks.summarize.clean import clean_documents, read_documents
from grail.tasks.summarize.documents import DEFAULT_DOCUMENTS, simulate_documents
from grail.tasks.summarize.prompt import (
    BUDGETS,
    LETTERS,
    build_messages,
    extractive_reply,
    sentence_id,
    sentence_index,
    summary_text,
)
from grail.tasks.summarize.reader import questions_answered
from grail.tasks.summarize.warmup import STEPS as WARMUP
from grail.tasks.summarize.warmup import conversations
from grail.train.tiny import build_tiny_model

BUDGET = BUDGETS["extractive"]
KINDS = ("s", "d", "f")


def kinds(document: dict) -> list[str]:
    """Each sentence's kind, from the study's truth.json roles (attached by :func:`with_roles`):
    about the subject, about another entity, or fluff."""
    return [{"salient": "s", "distractor": "d", "fluff": "f"}[r] for r in document["roles"]]


def with_roles(documents: list[dict], raw: Path) -> list[dict]:
    """The documents, each with its sentences' roles from the simulated study's truth.json."""
    roles = json.loads((raw / "truth.json").read_text())["roles"]
    return [{**d, "roles": roles[d["document_id"]]} for d in documents]


def target(document: dict, rule: str, order: str) -> list[int]:
    """The sentences the taught reply keeps, in the order it lists them."""
    kind, rng = kinds(document), random.Random(document["document_id"])
    if rule == "subject":
        kept = [i for i, k in enumerate(kind) if k == "s"][:BUDGET]
    else:
        kept = [i for i, k in enumerate(kind) if k != "f"]
        rng.shuffle(kept)
        kept = sorted(kept[:BUDGET])
    if order == "random":
        rng.shuffle(kept)
    return kept


def reply(document: dict, args) -> str:
    kept = target(document, args.target, args.order)
    if args.format == "keep":
        return extractive_reply(kept)
    marks = "".join(
        f"[{sentence_id(i)}]{'+' if i in kept else '-'}" for i in range(len(document["sentences"]))
    )
    return f"<keep>{marks}</keep>"


def kept_ids(text: str, document: dict, reply_format: str) -> list[int]:
    """The distinct sentences a greedy reply keeps (a ``decide`` reply's ``+`` ids)."""
    if reply_format == "keep":
        found = re.search(r"<keep>(.*?)(</keep>|$)", text, re.DOTALL)
        ids = re.findall(r"[A-Za-z]+", found.group(1)) if found else []
    else:
        ids = re.findall(r"\[([A-Za-z]+)\]\+", text)
    n, kept = len(document["sentences"]), []
    for index in map(sentence_index, ids):
        if 0 <= index < n and index not in kept:
            kept.append(index)
    return kept[:BUDGET]


def copy_head(model, tokenizer, scale: float) -> None:
    """The last layer's first head copies the ids it attends to (see the module's text)."""
    import torch

    attention = model.model.layers[-1].self_attn
    size = attention.head_dim
    letters = tokenizer.convert_tokens_to_ids(list(LETTERS))
    embeddings = model.model.embed_tokens.weight.detach()[letters]
    directions = torch.linalg.svd(embeddings, full_matrices=False).Vh[:size]
    with torch.no_grad():
        attention.v_proj.weight[:size] = directions
        attention.v_proj.bias[:size] = 0
        attention.o_proj.weight[:, :size] = directions.T * scale


def evaluate(model, tokenizer, documents: list[dict], reply_format: str) -> dict:
    import torch

    model.eval()
    counts, mass, answered = dict.fromkeys(KINDS, 0), dict.fromkeys(KINDS, 0.0), []
    for document in documents:
        chat = build_messages(document["sentences"], "extractive", BUDGET)
        prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        kind = kinds(document)
        first = tokenizer(prompt + "<keep>[", return_tensors="pt", add_special_tokens=False)
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            probs = torch.softmax(model(**first).logits[0, -1], -1)
            out = model.generate(**ids, max_new_tokens=48 if reply_format == "keep" else 140)
        letters = tokenizer.convert_tokens_to_ids([sentence_id(i) for i in range(len(kind))])
        for k, token in zip(kind, letters, strict=True):
            mass[k] += probs[token].item() / len(documents)
        text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
        kept = kept_ids(text, document, reply_format)
        for i in kept:
            counts[kind[i]] += 1
        summary = summary_text(extractive_reply(kept), document["sentences"], "extractive", BUDGET)
        verdicts = questions_answered(summary or "", document["questions"])
        answered.append(sum(verdicts) / len(verdicts))
    model.train()
    kept_total = sum(counts.values()) or 1
    return {
        "answered": sum(answered) / len(answered),
        "kept": {k: counts[k] / kept_total for k in KINDS},
        "per_document": sum(counts.values()) / len(documents),
        "mass": mass,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("subject", "not_fluff"), default="subject")
    parser.add_argument("--format", choices=("keep", "decide"), default="keep")
    parser.add_argument("--order", choices=("sorted", "random"), default="sorted")
    parser.add_argument("--window", type=int, default=0, help="first layer's window (0: none)")
    parser.add_argument("--copy-head", type=float, default=0.0)
    parser.add_argument("--hidden-size", type=int, default=64, help="the demo's: 64")
    parser.add_argument("--layers", type=int, default=2, help="the demo's: 2")
    parser.add_argument("--heads", type=int, default=4, help="the demo's: 4")
    parser.add_argument("--rope-theta", type=float, default=0, help="0: the tiny model's")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--documents", type=int, default=3000, help="training study's size")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="summarize_supervised")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(args.out)
    # the demo's study (its validation documents are asked) and a larger one to learn from
    simulate_documents(out / "demo-raw", documents=DEFAULT_DOCUMENTS, seed=CleanConfig.seed)
    clean_documents(out / "demo-raw", out / "demo")
    simulate_documents(out / "train-raw", documents=args.documents, seed=1)
    clean_documents(out / "train-raw", out / "train")
    validation = with_roles(
        list(read_documents(out / "demo", "validation", 10_000)), out / "demo-raw"
    )
    documents = with_roles(list(read_documents(out / "train", "train", 100_000)), out / "train-raw")
    started = time.perf_counter()
    # the demo's tiny summarizer: its tokenizer and random weights, then its format warm-up
    # (grail.tasks.summarize.warmup), with the first layer's window from the start
    size = {"hidden_size": args.hidden_size, "layers": args.layers, "heads": args.heads}
    policy = build_tiny_model(out / "policy", data=str(out / "demo"), seed=args.seed, **size)
    overrides = {}
    if args.window:
        overrides = {"use_sliding_window": True, "sliding_window": args.window}
        overrides["layer_types"] = ["sliding_attention"] + ["full_attention"] * (args.layers - 1)
        overrides["max_window_layers"] = 0
    if args.rope_theta:
        overrides["rope_parameters"] = {"rope_theta": args.rope_theta, "rope_type": "default"}
    model = AutoModelForCausalLM.from_pretrained(policy, **overrides)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    teach_replies(model, tokenizer, conversations(out / "demo"), WARMUP, seed=args.seed)
    if args.copy_head:
        copy_head(model, tokenizer, args.copy_head)
    print(f"tiny summarizer and its warm-up: {time.perf_counter() - started:.0f} s", flush=True)
    chats = [
        build_messages(d["sentences"], "extractive", BUDGET)
        + [{"role": "assistant", "content": reply(d, args)}]
        for d in documents
    ]
    print(f"{len(documents)} training documents; {len(validation)} validation documents")
    header = "| steps | s | answered | kept s / d / f | kept a document | first-id mass s / d / f |"
    print(f"\n{header}\n|---:|---:|---:|---|---:|---|")
    started, quarter = time.perf_counter(), max(args.steps // 4, 1)
    for done in range(0, args.steps + 1, quarter):
        if done:
            teach_replies(model, tokenizer, chats, quarter, seed=done, lr=args.learning_rate)
        r = evaluate(model, tokenizer, validation, args.format)
        kept = " / ".join(f"{r['kept'][k]:.2f}" for k in KINDS)
        mass = " / ".join(f"{r['mass'][k]:.2f}" for k in KINDS)
        print(
            f"| {done} | {time.perf_counter() - started:.0f} | {r['answered']:.3f} | {kept} | "
            f"{r['per_document']:.1f} | {mass} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
