"""The summarize task's part of ``grail generate``: a teacher's summaries of the training
documents, asked with the training prompt (the recipe's mode and budget), scored by the task's
rewards; each document's best-answering summary becomes an SFT conversation (a teacher distilled
before RL, as ART's sft-rl notebook does), and its best and worst summaries a preference pair.

Where the questions carry no deterministic reader's fields (RepLiQA itself) no reader is asked
here: the teacher's parsed summaries are kept unscored (``answered`` is left out, and the
summary says so), the first parsed one of each document.
"""

from __future__ import annotations

import json
import logging

from grail.core.errors import GrailError
from grail.core.rewards import resolve_rewards
from grail.tasks import Generation

logger = logging.getLogger(__name__)


def inputs(data, config, options=None) -> list[dict]:
    """Each training document's prompt, num_generations times, with its sentences and
    questions (JSON) for scoring."""
    from grail.tasks.summarize.clean import read_documents
    from grail.tasks.summarize.prompt import BUDGETS, MODES, build_messages

    if config.template:
        raise GrailError("template: the slate task's; a summary is asked with the training prompt")
    if config.summary_mode not in MODES:
        raise GrailError(f"summary_mode must be one of {list(MODES)}, got {config.summary_mode!r}")
    budget = config.summary_budget or BUDGETS[config.summary_mode]
    made = []
    for doc in read_documents(data, config.split, config.limit, model_reader=True):
        system, user = build_messages(doc["sentences"], config.summary_mode, budget)
        made += [
            {
                "instruction": user["content"],
                "system_prompt": system["content"],
                "document_id": doc["document_id"],
                "generation_index": k,
                "sentences": list(doc["sentences"]),
                "questions_json": json.dumps(doc["questions"]),
                "summary_budget": budget,
            }
            for k in range(config.num_generations)
        ]
    return made


def record(output: dict, model: str, config) -> dict:
    """One row of generated.parquet: the conversation, the summary and how it was asked."""
    return {
        "document_id": output["document_id"],
        "generation_index": output["generation_index"],
        "prompt": [
            {"role": "system", "content": output["system_prompt"]},
            {"role": "user", "content": output["instruction"]},
        ],
        "completion": output["generation"],
        "sentences": output["sentences"],
        "questions_json": output["questions_json"],
        "summary_mode": config.summary_mode,
        "summary_budget": output["summary_budget"],
        "model": model,
        "temperature": config.temperature,
        "max_new_tokens": config.max_new_tokens,
    }


def scorable(records: list[dict]) -> bool:
    """Whether the deterministic reader can read these documents' questions."""
    return all(
        q.get("entity_aliases") and q.get("cues")
        for r in records
        for q in json.loads(r["questions_json"])
    )


def score(records: list[dict], reward_names: list[str], weights: list[float] | None) -> None:
    """Each reward and the weighted total on every record, in place; ``parsed`` where the reply
    holds a summary in the format; ``correct`` on each document's best parsed summary (the
    first of a tie): the one kept."""
    from grail.tasks.summarize.prompt import summary_text
    from grail.tasks.summarize.rewards import REWARDS

    names = list(reward_names)
    if not scorable(records) and "answered" in names:
        logger.warning(
            "these questions need a model reader (RepLiQA): the teacher's summaries are kept "
            "unscored by it (answered left out)"
        )
        keep_weights = (
            None
            if weights is None
            else [w for n, w in zip(names, weights, strict=True) if n != "answered"]
        )
        names, weights = [n for n in names if n != "answered"], keep_weights
    funcs, normalized = resolve_rewards(names, weights, REWARDS) if names else ([], [])
    columns = {
        "sentences": [r["sentences"] for r in records],
        "questions": [json.loads(r["questions_json"]) for r in records],
        "summary_mode": [r["summary_mode"] for r in records],
        "summary_budget": [r["summary_budget"] for r in records],
    }
    completions = [r["completion"] for r in records]
    for name, func, weight in zip(names, funcs, normalized, strict=True):
        values = func([r["prompt"] for r in records], completions, **columns)
        for item, value in zip(records, values, strict=True):
            item[f"reward_{name}"] = value
            item["reward"] = item.get("reward", 0.0) + weight * (value or 0.0)
    best: dict[str, dict] = {}
    for item in records:
        item.setdefault("reward", 0.0)
        item["parsed"] = (
            summary_text(
                item["completion"], item["sentences"], item["summary_mode"], item["summary_budget"]
            )
            is not None
        )
        item["correct"] = False
        held = best.get(item["document_id"])
        if item["parsed"] and (held is None or item["reward"] > held["reward"]):
            best[item["document_id"]] = item
    for item in best.values():
        item["correct"] = True


def keep(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """Each document's kept summary as an SFT conversation; its kept and its worst summary as
    a preference pair where the worst scored less."""
    sft, pairs = [], []
    by_document: dict[str, list[dict]] = {}
    for item in records:
        by_document.setdefault(item["document_id"], []).append(item)
    for document_id, group in by_document.items():
        kept = [r for r in group if r["correct"]]
        if not kept:
            continue
        (chosen,) = kept
        sft.append(
            {
                "document_id": document_id,
                "messages": chosen["prompt"]
                + [{"role": "assistant", "content": chosen["completion"]}],
            }
        )
        worst = min(group, key=lambda r: (r["parsed"], r["reward"]))
        if (worst["parsed"], worst["reward"]) < (True, chosen["reward"]):
            pairs.append(
                {
                    "document_id": document_id,
                    "prompt": chosen["prompt"],
                    "chosen": [{"role": "assistant", "content": chosen["completion"]}],
                    "rejected": [{"role": "assistant", "content": worst["completion"]}],
                }
            )
    return sft, pairs


def schemas():
    """sft.parquet's and preferences.parquet's schemas (written even when empty)."""
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    sft = pa.schema([("document_id", pa.string()), ("messages", pa.list_(message))])
    pairs = pa.schema(
        [("document_id", pa.string())]
        + [(name, pa.list_(message)) for name in ("prompt", "chosen", "rejected")]
    )
    return sft, pairs


GENERATION = Generation(
    rewards=("answered", "summary_format"),
    inputs=inputs,
    record=record,
    score=score,
    keep=keep,
    schemas=schemas,
)
