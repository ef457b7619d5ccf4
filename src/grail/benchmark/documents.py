"""The summarize task's benchmark: baselines, ceilings and models on the same validation
documents, through the same prompt and reader (``grail benchmark --task summarize``).

Every system gets the share of questions answered with a document-bootstrap interval, the share
of answerable ones, parse rate, words, compression and faithfulness violations; a trained model's
series (step 0 and each checkpoint) gets its final-minus-start difference, paired by document,
and every model its win rate (1 / 0.5 / 0 per document) against each baseline. Writes
``metrics.json``, ``report.md`` and ``summaries.jsonl`` (every system's summary of every
document) under the output folder, complete or not at all.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path

from grail.core.outputs import atomic_folder
from grail.tasks.summarize.baselines import BASELINES, CEILINGS
from grail.tasks.summarize.clean import read_documents
from grail.tasks.summarize.metrics import (
    paired_answered,
    score_document,
    summarize_scores,
    win_rate,
)
from grail.tasks.summarize.prompt import BUDGETS, build_messages, summary_text
from grail.tasks.summarize.report import report_markdown

logger = logging.getLogger(__name__)


def model_summaries(spec, documents: list[dict], mode: str, budget: int, tokens: int, batch):
    """What the reader sees of a local model's reply to every document (None: no summary)."""
    from grail.benchmark.predict import generate_transformers

    conversations = [build_messages(d["sentences"], mode, budget) for d in documents]
    replies = generate_transformers(spec.path, conversations, tokens, batch)
    return [summary_text(r, d["sentences"], mode, budget) for r, d in zip(
        replies, documents, strict=True
    )]  # fmt: skip


def benchmark_documents(
    data: str | Path,
    out: str | Path,
    models: list[str] = (),
    mode: str = "extractive",
    budget: int | None = None,
    split: str = "validation",
    limit: int | None = None,
    max_new_tokens: int | None = None,
    batch_size: int = 8,
    label: str | None = None,
) -> dict:
    """Score the baselines and `models` (folders, training outputs with their checkpoints) on
    `split`; returns the metrics (also ``out/metrics.json``). Each model writes
    `max_new_tokens`, else as many tokens as it was trained to (its ``prompt.json``), else 64."""
    from grail.benchmark.predict import expand_spec
    from grail.benchmark.systems import trained_prompt

    budget = budget or BUDGETS[mode]
    documents = read_documents(data, split, limit)
    ids = [d["document_id"] for d in documents]
    systems: dict[str, dict] = {}
    scores: dict[str, list[dict]] = {}
    texts: dict[str, list[str | None]] = {}
    for name, pick in BASELINES.items():
        kept = [pick(d, budget) for d in documents]
        texts[name] = [" ".join(d["sentences"][k] for k in ks) for d, ks in zip(
            documents, kept, strict=True
        )]  # fmt: skip
        scores[name] = [score_document(t, d) for t, d in zip(texts[name], documents, strict=True)]
        systems[name] = {"kind": "ceiling" if name in CEILINGS else "baseline"}
    with tempfile.TemporaryDirectory(prefix="grail-benchmark-") as workdir:
        specs = [s for text in models for s in expand_spec(text, Path(workdir))]
        for spec in specs:
            started = time.perf_counter()
            tokens = max_new_tokens or trained_prompt(spec).get("max_new_tokens", 64)
            texts[spec.name] = model_summaries(spec, documents, mode, budget, tokens, batch_size)
            scores[spec.name] = [
                score_document(t, d) for t, d in zip(texts[spec.name], documents, strict=True)
            ]
            systems[spec.name] = {"kind": "model", "step": spec.step, "series": spec.series}
            systems[spec.name]["seconds"] = round(time.perf_counter() - started, 2)
            logger.info(
                "%s: %d documents, %.0f s",
                spec.name,
                len(documents),
                systems[spec.name]["seconds"],
            )
    for name, entry in systems.items():
        entry |= summarize_scores(scores[name], ids)
    result = {
        "task": "summarize",
        "data": label or str(data),
        "split": split,
        "mode": mode,
        "budget": budget,
        "documents": len(documents),
        "intervals": "95% percentile bootstrap over documents (1000 replicates, seed 0)",
        "systems": systems,
        "differences": series_differences(systems, scores, ids),
        "win_rates": {
            model: {
                base: win_rate(scores[model], scores[base], ids)
                for base in BASELINES
                if base not in CEILINGS
            }
            for model, entry in systems.items()
            if entry["kind"] == "model"
        },
    }
    with atomic_folder(out, "benchmark") as staging:  # complete or absent, never mixed
        (staging / "metrics.json").write_text(json.dumps(result, indent=1) + "\n")
        (staging / "report.md").write_text(report_markdown(result))
        with (staging / "summaries.jsonl").open("w") as f:
            for name, summaries in texts.items():
                for doc_id, text in zip(ids, summaries, strict=True):
                    f.write(json.dumps({"system": name, "document_id": doc_id, "summary": text}))
                    f.write("\n")
    return result


def series_differences(systems: dict, scores: dict, ids: list[str]) -> dict:
    """Each trained series' last model minus its step 0, questions answered, paired by
    document."""
    series: dict[str, list[tuple[int, str]]] = {}
    for name, entry in systems.items():
        if entry.get("series"):
            series.setdefault(entry["series"], []).append((entry.get("step") or 0, name))
    out = {}
    for label, members in series.items():
        members.sort()
        (first_step, start), (_, final) = members[0], members[-1]
        if first_step == 0 and start != final:
            out[label] = paired_answered(scores[final], scores[start], ids) | {
                "final": final,
                "start": start,
            }
    return out
