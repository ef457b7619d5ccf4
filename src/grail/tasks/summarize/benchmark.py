"""The summarize task's benchmark: baselines, ceilings and models on the same validation
documents, through the same prompt and reader (``grail benchmark --task summarize``).

Every system gets the share of questions answered with a document-bootstrap interval, the share
of answerable ones, parse rate, words, compression and faithfulness violations; a trained model's
series (step 0 and each checkpoint) gets its final-minus-start difference, paired by document,
and every model its win rate (1 / 0.5 / 0 per document) against each baseline.

Each local model is asked the way it was trained (the mode, budget and reply length in its
``prompt.json``) unless a setting is given here; API models (``openai:NAME[@URL]``) and the
baselines are asked the way the trained model is. The synthetic study is read by the
deterministic reader; RepLiQA by a model reader and judge (``reader``, ``judge``: the trained
model's prompt.json names the recipe's), whose failures are counted as missing, never as 0.

Writes ``metrics.json``, ``report.md``, ``summaries.jsonl`` (every system's summary of every
document) and the two charts under the output folder, complete or not at all; logs them with
the metrics under stable names (:func:`document_metrics`) to MLflow when tracking. :func:`run`
is the task's ``benchmark`` part (:data:`grail.tasks.PARTS`), which the benchmark stage calls.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from grail.core import tracking
from grail.core.outputs import atomic_folder, check_writable, work_folder
from grail.core.serving import chat_replies
from grail.inference.local import generate_transformers
from grail.inference.specs import expand_specs, run_markers, trained_prompt
from grail.tasks import DEFAULT_TASK, recorded_task
from grail.tasks.headline import chosen_fields, role
from grail.tasks.summarize.baselines import BASELINES, CEILINGS, baseline_summary, position_only
from grail.tasks.summarize.clean import read_documents
from grail.tasks.summarize.metrics import (
    paired_answered,
    score_document,
    summarize_scores,
    win_rate,
)
from grail.tasks.summarize.model_reader import ModelReader
from grail.tasks.summarize.prompt import BUDGETS, build_messages, summary_text
from grail.tasks.summarize.report import chart_by_model, chart_by_step, report_markdown

logger = logging.getLogger(__name__)

DEFAULT_TOKENS = 64
COMPARE = None  # no comparison of algorithms (grail compare): the summarize task has none
COUNTERFACTUAL = None  # no counterfactual sessions: they need the slate task's recommenders


def run(config, prompt: dict, label: str | None, trained: str | None, branch: dict | None) -> dict:
    """The task's ``benchmark`` part: :func:`benchmark_documents` with the benchmark stage's
    settings (`config`, its ``BenchmarkConfig``); `prompt` (the slate task's prompt fields)
    asks nothing here: a summary's mode and budget are `config`'s."""
    return benchmark_documents(
        config.data,
        config.out,
        models=config.models,
        mode=config.summary_mode,
        budget=config.summary_budget,
        split=config.split,
        limit=config.limit,
        max_new_tokens=config.max_new_tokens,
        batch_size=config.batch_size,
        label=label,
        trained=trained,
        start_model=config.start_model,
        branch=branch,
        reader=config.reader,
        judge=config.judge,
        concurrency=config.concurrency,
        bootstrap=config.bootstrap,
        task=config.task,
    )


def asked_as(spec, given: dict, task: str) -> dict:
    """How a model is asked: the settings given, else its training's prompt.json (when it was
    trained on `task`, the data's), else the defaults (extractive, its budget, 64 tokens)."""
    own = trained_prompt(spec) if spec is not None else {}
    own = own if own.get("task", DEFAULT_TASK) == task else {}  # asked as trained on this task
    mode = given.get("summary_mode") or own.get("summary_mode") or "extractive"
    budget = given.get("summary_budget")
    if budget is None and mode == own.get("summary_mode"):
        budget = own.get("summary_budget")
    return {
        "summary_mode": mode,
        "summary_budget": BUDGETS[mode] if budget is None else budget,
        "max_new_tokens": given.get("max_new_tokens")
        or own.get("max_new_tokens")
        or DEFAULT_TOKENS,
        "summary_reader": own.get("summary_reader"),
        "summary_judge": own.get("summary_judge"),
    }


def model_summaries(spec, documents: list[dict], prompt: dict, batch: int, concurrency: int):
    """What the reader sees of a model's reply to every document (None: no summary in the
    format), and the documents whose request failed (an API model's: missing, not 0)."""
    mode, budget = prompt["summary_mode"], prompt["summary_budget"]
    conversations = [build_messages(d["sentences"], mode, budget) for d in documents]
    if spec.kind == "openai":
        replies = chat_replies(spec, conversations, prompt["max_new_tokens"], concurrency)
    else:
        replies = generate_transformers(spec.path, conversations, prompt["max_new_tokens"], batch)
    failed = {k for k, reply in enumerate(replies) if reply is None}
    summaries = [
        None if reply is None else summary_text(reply, d["sentences"], mode, budget)
        for reply, d in zip(replies, documents, strict=True)
    ]
    return summaries, failed


def benchmark_documents(
    data: str | Path,
    out: str | Path,
    models: list[str] = (),
    mode: str | None = None,
    budget: int | None = None,
    split: str = "validation",
    limit: int | None = None,
    max_new_tokens: int | None = None,
    batch_size: int = 8,
    label: str | None = None,
    trained: str | None = None,
    start_model: str | None = None,
    branch: dict | None = None,
    reader: str | None = None,
    judge: str | None = None,
    concurrency: int = 8,
    bootstrap: int = 1000,
    task: str | None = None,
) -> dict:
    """Score the baselines and `models` (folders, training outputs with their checkpoints,
    ``openai:`` specs) on `split`; returns the metrics (also ``out/metrics.json``).

    `trained` names the series this run is about (MLflow's ``trained``), `start_model` its
    step 0, `branch` the pipeline branch; `reader` and `judge` replace the ones the trained
    model's prompt.json names; `bootstrap`: the replicates behind every interval; `task`: the
    data's (default: as its audit records it)."""
    given = {"summary_mode": mode, "summary_budget": budget, "max_new_tokens": max_new_tokens}
    check_writable(out, "benchmark")  # before minutes of scoring, not after
    runs = run_markers(list(models))  # the runs scored, checked against their markers
    with work_folder("benchmark") as workdir:
        specs = expand_specs(list(models), Path(workdir), start_model)
        task = task or recorded_task(data)
        prompts = {s.name: asked_as(s, given, task) for s in specs}
        # the baselines and API models are asked as the trained (first local) model is
        first = next(
            (prompts[s.name] for s in specs if s.kind == "local"), asked_as(None, given, task)
        )
        prompts |= {s.name: first for s in specs if s.kind == "openai"}
        reader, judge = reader or first["summary_reader"], judge or first["summary_judge"]
        documents = read_documents(data, split, limit, model_reader=bool(reader))
        model_reader = ModelReader(reader, judge, concurrency) if reader else None
        if model_reader is not None:
            model_reader.probe()
        systems, texts, failed = baseline_systems(documents, first)
        ask_models(specs, documents, prompts, (systems, texts, failed), batch_size, concurrency)
    ids = [d["document_id"] for d in documents]
    scores = {n: scored(texts[n], failed[n], documents, model_reader) for n in systems}
    for name, entry in systems.items():
        entry |= summarize_scores(scores[name], ids, bootstrap)
        entry["failed_requests"] = len(failed[name])
    result = {
        "task": task,
        "scored_as": "documents",
        "data": label or str(data),
        **({"branch": branch} if branch else {}),
        "trained": trained,
        "split": split,
        "mode": first["summary_mode"],
        "budget": first["summary_budget"],
        "documents": len(documents),
        "reader": model_reader.record() if model_reader else {"reader": None},
        "intervals": f"95% percentile bootstrap over documents ({bootstrap} replicates, seed 0)",
        "systems": systems,
        "differences": series_differences(systems, scores, ids, bootstrap),
        "chosen": chosen_summarizer(systems, scores, ids, trained, bootstrap),
        "win_rates": win_rates(systems, scores, ids, bootstrap),
        "position_only": position_only_ceiling(documents, first, ids, bootstrap),
        "runs": runs,
    }
    write_outputs(Path(out), result, texts, ids)
    if tracking.enabled():
        tracking.log_nested_run(document_metrics(result, trained), Path(out), "benchmark")
    return result


def position_only_ceiling(documents, prompt: dict, ids, bootstrap: int) -> dict | None:
    """The position-only ceiling (:func:`grail.tasks.summarize.baselines.position_only`) with
    its document-bootstrap interval: extractive summaries of the synthetic study only."""
    from grail.tasks.summarize.metrics import mean_with_interval

    if prompt["summary_mode"] != "extractive":
        return None
    shares = [position_only(d, prompt["summary_budget"]) for d in documents]
    if any(share is None for share in shares):
        return None
    return mean_with_interval(shares, ids, bootstrap)


PROMPT_FIELDS = ("summary_mode", "summary_budget", "max_new_tokens")


def ask_models(specs, documents, prompts: dict, into: tuple, batch_size: int, concurrency: int):
    """Every model's summaries of `documents` into `into` (systems, texts, failed): one local
    model asked one way is answered once, under each of its names."""
    systems, texts, failed = into
    asked: dict[tuple, tuple] = {}
    for spec in specs:
        started = time.perf_counter()
        key = (spec.kind, spec.path or spec.name, json.dumps(prompts[spec.name]))
        if key not in asked:
            asked[key] = model_summaries(
                spec, documents, prompts[spec.name], batch_size, concurrency
            )
        texts[spec.name], failed[spec.name] = asked[key]
        systems[spec.name] = {
            "kind": "model",
            "step": spec.step,
            "series": spec.series,
            "prompt": {k: prompts[spec.name][k] for k in PROMPT_FIELDS},
            "seconds": round(time.perf_counter() - started, 2),
        }
        logger.info(
            "%s: %d documents, %.0f s", spec.name, len(documents), time.perf_counter() - started
        )


def baseline_systems(documents: list[dict], prompt: dict):
    """The baselines' and ceilings' entries, summaries and (no) failed requests; the oracle
    only where the deterministic reader's fields say which sentences answer."""
    systems, texts, failed = {}, {}, {}
    for name in BASELINES:
        summaries = [
            baseline_summary(name, d, prompt["summary_mode"], prompt["summary_budget"])
            for d in documents
        ]
        if all(t is None for t in summaries):
            continue
        texts[name], failed[name] = summaries, set()
        systems[name] = {"kind": "ceiling" if name in CEILINGS else "baseline"}
    return systems, texts, failed


def win_rates(systems: dict, scores: dict, ids: list[str], replicates: int = 1000) -> dict:
    """Every model's win rate against every baseline (not the ceilings) and every model of
    another series (an API model, another run's final model)."""

    def final(name: str) -> bool:  # a series' last model stands for it
        series = systems[name].get("series")
        steps = [
            e.get("step") or 0 for e in systems.values() if series and e.get("series") == series
        ]
        return not series or (systems[name].get("step") or 0) == max(steps)

    return {
        model: {
            other: win_rate(scores[model], scores[other], ids, replicates)
            for other, against in systems.items()
            if against["kind"] == "baseline"
            or (
                against["kind"] == "model"
                and other != model
                and final(other)
                and (against.get("series") is None or against.get("series") != entry.get("series"))
            )
        }
        for model, entry in systems.items()
        if entry["kind"] == "model"
    }


def write_outputs(out: Path, result: dict, texts: dict, ids: list[str]) -> None:
    """metrics.json, report.md, summaries.jsonl and the charts, complete or absent."""
    with atomic_folder(out, "benchmark") as staging:  # never mixed with an earlier run's
        result["charts"] = ["answered_by_model.svg"]
        if chart_by_step(result, staging / "answered_vs_step.svg"):
            result["charts"].append("answered_vs_step.svg")
        chart_by_model(result, staging / "answered_by_model.svg")
        (staging / "metrics.json").write_text(json.dumps(result, indent=1) + "\n")
        (staging / "report.md").write_text(report_markdown(result))
        with (staging / "summaries.jsonl").open("w") as f:
            for name, summaries in texts.items():
                for doc_id, text in zip(ids, summaries, strict=True):
                    f.write(json.dumps({"system": name, "document_id": doc_id, "summary": text}))
                    f.write("\n")


def scored(summaries, failed: set[int], documents: list[dict], model_reader) -> list[dict]:
    """Each document's scores: read by the model reader when there is one (else the
    deterministic reader); a failed request's document has every verdict missing."""
    verdicts = (
        model_reader.read(
            [None if k in failed else s for k, s in enumerate(summaries)],
            [d["questions"] for d in documents],
            [d["text"] for d in documents],
        )
        if model_reader is not None
        else [None] * len(documents)
    )
    for k in failed:
        verdicts[k] = [None] * len(documents[k]["questions"])
    return [
        score_document(summary, document, v)
        for summary, document, v in zip(summaries, documents, verdicts, strict=True)
    ]


def chosen_summarizer(
    systems: dict, scores: dict, ids: list[str], trained: str | None, replicates: int = 1000
) -> dict | None:
    """The checkpoint of the trained series the pipeline exports
    (:func:`grail.core.selection.choose_checkpoint`): the highest share answered among
    the run's checkpoints (step 0 left out), where it beats the last by more than its paired
    document-bootstrap interval; None without a trained series."""
    from grail.core.selection import choose_checkpoint
    from grail.tasks.summarize.metrics import paired_answered

    names = {
        entry.get("step") or 0: name
        for name, entry in systems.items()
        if trained and entry.get("series") == trained and entry.get("answered")
    }
    steps = {step: name for step, name in names.items() if step > 0}
    if not steps:
        return None
    chosen = choose_checkpoint(
        {step: systems[name]["answered"]["mean"] for step, name in steps.items()},
        lambda a, b: paired_answered(scores[steps[a]], scores[steps[b]], ids, replicates),
        lower_is_better=False,
        metric="share answered",
    )
    return chosen | {"system": steps[chosen["step"]]}


def series_differences(systems: dict, scores: dict, ids: list[str], replicates: int = 1000) -> dict:
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
            out[label] = paired_answered(scores[final], scores[start], ids, replicates) | {
                "final": final,
                "start": start,
                "series": label,
            }
    return out


DOCUMENT_FIELDS = (
    "answered",
    "answerable_answered",
    "parse_rate",
    "words",
    "compression",
    "unsupported_per_summary",
    "missing_verdicts",
    "failed_requests",
)
# what the pipeline's benchmark task returns of each system's final metrics (the task's
# ``benchmark_fields`` part)
SHOWN_FIELDS = (*DOCUMENT_FIELDS, "answered_ci_low", "answered_ci_high")


def document_metrics(result: dict, trained: str | None = None) -> list[tuple[str, float, int]]:
    """The summarize task's metrics under stable names (the task's ``benchmark_metrics`` part):
    every system's share answered (and its interval as ``answered_ci_low``/``_high``),
    answerable share, parse rate, words, compression, faithfulness and missing verdicts under
    ``ROLE/FIELD`` (:func:`grail.tasks.headline.role`), and each checkpoint's share answered as
    ``ROLE_by_step/answered`` at its step."""
    final: dict[str, dict] = {}
    out = []
    for name, entry in result["systems"].items():
        stem = role(name, entry, trained)
        if entry.get("step") is not None and entry.get("answered"):
            out.append((f"{stem}_by_step/answered", entry["answered"]["mean"], entry["step"]))
        if stem not in final or (entry.get("step") or -1) >= (final[stem].get("step") or -1):
            final[stem] = entry
    for stem, entry in final.items():
        for field in DOCUMENT_FIELDS:
            value = entry.get(field)
            if isinstance(value, dict):  # a mean with its interval
                out.append((f"{stem}/{field}", value["mean"], 0))
                if field == "answered":
                    out.append((f"{stem}/answered_ci_low", value["ci"][0], 0))
                    out.append((f"{stem}/answered_ci_high", value["ci"][1], 0))
            elif value is not None:
                out.append((f"{stem}/{field}", value, 0))
    return out


def documents_headline(result: dict, trained: str) -> dict:
    """The summarize task's headline (its ``headline`` part): the final model's share answered
    with its interval, its step 0's, the change with its paired interval, the best baseline and
    the ceilings."""
    values = {key: value for key, value, _ in document_metrics(result, trained)}
    out = {
        k: values[f"trained/{k}"]
        for k in ("answered", "answered_ci_low", "answered_ci_high", "parse_rate", "words")
        if f"trained/{k}" in values
    }
    for name, entry in result["systems"].items():
        if role(name, entry, trained) == "trained" and entry.get("step") == 0:
            out["start_answered"] = entry["answered"]["mean"] if entry["answered"] else None
    baselines = {
        key.split("/")[1]: value
        for key, value in values.items()
        if key.startswith("baseline/") and key.endswith("/answered")
    }
    if baselines:
        best = max(baselines, key=baselines.get)
        out["best_baseline"], out["best_baseline_answered"] = best, baselines[best]
    for ceiling in ("oracle", "full_document"):
        if f"ceiling/{ceiling}/answered" in values:
            out[f"{ceiling}_answered"] = values[f"ceiling/{ceiling}/answered"]
    for difference in result.get("differences", {}).values():
        if (difference.get("series") or "") == trained:
            key = "final_minus_start/answered"  # as the slate task's differences are named
            out[f"{key}_difference"] = difference["difference"]
            out[f"{key}_ci_low"], out[f"{key}_ci_high"] = difference["ci"]
    return {k: v for k, v in out.items() if v is not None} | chosen_fields(result)
