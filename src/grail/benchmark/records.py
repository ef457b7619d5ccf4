"""What the benchmark leaves: every prediction as a row (``predictions.parquet``), the metrics
under stable names, the headline of a trained model, and all of it logged to MLflow."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from grail.benchmark.systems import System
from grail.tasks.slate import metrics as m
from grail.tasks.slate.baselines import BLIND_CEILING, EXPECTED_CEILING, ORACLE

logger = logging.getLogger(__name__)


def write_predictions(path: Path, systems: list[System], rows: list[dict], choices=None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = []
    for s in systems:
        if s.predictions is None:
            continue
        for k, (row, predicted) in enumerate(zip(rows, s.predictions, strict=True)):
            records.append(
                {
                    "system": s.name,
                    "kind": s.kind,
                    "series": s.series,
                    "step": s.step,
                    "session_id": row["session_id"],
                    "step_index": row["step_index"],
                    "issue": row["issue"],
                    "study": row["study"],
                    "gold_index": row["gold_index"],
                    "participant_id": row["participant_id"],
                    "predicted_index": predicted,
                    "correct": predicted == row["gold_index"],
                    "distribution": s.distributions[k] if s.distributions else None,
                    "log_loss": m.row_log_loss(s.distributions[k], row["gold_index"])
                    if s.distributions
                    else None,
                    "expected_log_loss": m.cross_entropy(choices[k], s.distributions[k])
                    if s.distributions and choices
                    else None,
                    "completion": s.completions[k] if s.completions else None,
                    "opinion": s.opinions[k] if s.opinions else None,
                }
            )
    pq.write_table(pa.Table.from_pylist(records), path)


TRUTH_IDS = {EXPECTED_CEILING: "bayes_optimal", BLIND_CEILING: "position_blind", ORACLE: "oracle"}
SUMMARY_FIELDS = (
    "accuracy",
    "ci_low",
    "ci_high",
    "parse_rate",
    "log_loss",
    "expected_log_loss",
    "brier",
    "ece",
    "position_tv",
    "slant_tv",
    "score_vs_prior",
    "score_vs_uniform",
)
BY_STEP_FIELDS = ("accuracy", "log_loss", "expected_log_loss")
CLONED = "-cloned"  # the benchmark's name for a trained model's warm start: TRAINED-cloned


def identifier(name: str) -> str:
    """A system's name as a metric-key part: no spaces, no parenthesised remark.

    >>> identifier("random (expected)"), identifier("Qwen/Qwen2.5-1.5B-Instruct@host:8000")
    ('random', 'Qwen_Qwen2.5-1.5B-Instruct_host_8000')
    """
    return re.sub(r"[^\w\-.]+", "_", name.split(" (")[0]).strip("_")


def role(name: str, entry: dict, trained: str | None) -> str:
    """What a system is, as the stem of its metric keys: ``trained`` (the model this run
    trained), ``cloned`` (its behaviour-cloned warm start, ``TRAINED-cloned``), ``baseline/ID``,
    ``ceiling/ID`` (what the study's own choice model knows) or ``model/ID`` (a reference
    model). Stable across runs and algorithms (which stay the runs' params), so MLflow's
    compare view lines two runs up column by column.

    >>> role("grpo-gun-cloned", {"kind": "model"}, "grpo-gun")
    'cloned'
    >>> role("Qwen/Qwen2.5-1.5B-Instruct", {"kind": "model"}, "grpo-gun")
    'model/Qwen_Qwen2.5-1.5B-Instruct'
    """
    series = entry.get("series") or name
    if trained is not None and series == trained:
        return "trained"
    if trained is not None and series == f"{trained}{CLONED}":
        return "cloned"
    if name in TRUTH_IDS:
        return f"ceiling/{TRUTH_IDS[name]}"
    if entry["kind"] == "ceiling":
        return f"ceiling/{identifier(name)}"
    if entry["kind"] in ("baseline", "expected"):
        return f"baseline/{identifier(name)}"
    return f"model/{identifier(series)}"


def stable_metrics(result: dict, trained: str | None = None) -> list[tuple[str, float, int]]:
    """(key, value, step) for MLflow: every system's accuracy, CI, parse rate and simulator
    scores under ``ROLE/FIELD`` (a model's last checkpoint, i.e. the final model), and each
    checkpoint's accuracy and log-loss as ``ROLE_by_step/FIELD`` (MLflow refuses "@" in names)
    at its step (step 0: the starting model)."""
    final: dict[str, dict] = {}
    out = []
    for name, entry in result["systems"].items():
        stem = role(name, entry, trained)
        if entry.get("step") is not None:
            out += [
                (f"{stem}_by_step/{k}", entry[k], entry["step"])
                for k in BY_STEP_FIELDS
                if entry.get(k) is not None
            ]
        if stem not in final or (entry.get("step") or -1) >= (final[stem].get("step") or -1):
            final[stem] = entry
    for stem, entry in final.items():
        out += [(f"{stem}/{k}", entry[k], 0) for k in SUMMARY_FIELDS if entry.get(k) is not None]
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


def document_metrics(result: dict, trained: str | None = None) -> list[tuple[str, float, int]]:
    """:func:`stable_metrics` for the summarize task: every system's share answered (and its
    interval as ``answered_ci_low``/``_high``), answerable share, parse rate, words,
    compression, faithfulness and missing verdicts under ``ROLE/FIELD``, and each checkpoint's
    share answered as ``ROLE_by_step/answered`` at its step."""
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
    """The summarize task's headline: the final model's share answered with its interval, its
    step 0's, the change with its paired interval, the best baseline and the ceilings."""
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


def chosen_fields(result: dict) -> dict:
    """The checkpoint chosen for export (:mod:`grail.benchmark.selection`), as headline fields
    ``exported_step``, ``last_step`` and ``exported_reason``; none for a benchmark without one.

    >>> chosen_fields({"chosen": {"step": 2, "last_step": 4, "reason": "step 2 beats"}})
    {'exported_step': 2, 'last_step': 4, 'exported_reason': 'step 2 beats'}
    """
    chosen = result.get("chosen")
    if not chosen:
        return {}
    return {
        "exported_step": chosen["step"],
        "last_step": chosen["last_step"],
        "exported_reason": chosen["reason"],
    }


def benchmark_headline(result: dict, trained: str) -> dict:
    """The trained model against its references, for the pipeline run's summary: the final
    model's accuracy, CI and parse rate, the best checkpoint, the best baseline by accuracy and
    the best by log-loss (the one the paired difference ``final_minus_best_baseline`` is
    against), and the Bayes-optimal expectation when the data came from ``grail simulate``.
    A summarize benchmark has its own (:func:`documents_headline`)."""
    if result.get("scored_as") == "documents":
        return documents_headline(result, trained)
    values = {key: value for key, value, _ in stable_metrics(result, trained)}
    steps = [
        (entry["accuracy"], entry["step"])
        for name, entry in result["systems"].items()
        if role(name, entry, trained) == "trained" and entry.get("step") is not None
    ]
    baselines = {
        key.split("/")[1]: value
        for key, value in values.items()
        if key.startswith("baseline/") and key.endswith("/accuracy")
    }
    best = max(baselines, key=baselines.get) if baselines else None
    out = {k: values[f"trained/{k}"] for k in SUMMARY_FIELDS if f"trained/{k}" in values}
    if steps:
        out["best_step"], out["best_step_accuracy"] = max(steps)[1], max(steps)[0]
    if best:
        out["best_baseline"], out["best_baseline_accuracy"] = best, baselines[best]
    if "ceiling/bayes_optimal/accuracy" in values:
        out["ceiling_accuracy"] = values["ceiling/bayes_optimal/accuracy"]
    if "ceiling/bayes_optimal/log_loss" in values:
        out["ceiling_log_loss"] = values["ceiling/bayes_optimal/log_loss"]
    if "baseline/always_first/log_loss" in values:
        out["always_first_log_loss"] = values["baseline/always_first/log_loss"]
    signal = (result.get("training") or {}).get(trained, {}).get("rl_signal")
    if signal:
        out["rl_signal"] = signal
    against = (result.get("differences") or {}).get("final_minus_best_baseline") or {}
    by_log_loss = next((d["against"] for d in against.values() if d.get("against")), None)
    if by_log_loss and f"baseline/{by_log_loss}/log_loss" in values:
        out["best_log_loss_baseline"] = by_log_loss
        out["best_log_loss_baseline_log_loss"] = values[f"baseline/{by_log_loss}/log_loss"]
    cloned = result["systems"].get(f"{trained}{CLONED}")
    if cloned and cloned.get("log_loss") is not None:  # the warm start RL continued from
        out["cloned_log_loss"] = cloned["log_loss"]
    for name, entry in result["systems"].items():
        if role(name, entry, trained) == "trained" and entry.get("step") == 0:
            out |= {
                f"start_{k}": entry[k]
                for k in ("accuracy", "log_loss", "expected_log_loss")
                if k in entry
            }
        if role(name, entry, trained) == "trained" and entry.get("collapsed"):
            out["collapsed"] = entry["collapsed"]  # the final model's is the last one seen
    for label, difference in result.get("differences", {}).items():
        for metric, d in difference.items():
            out[f"{label}/{metric}_difference"] = d["difference"]
            out[f"{label}/{metric}_ci_low"], out[f"{label}/{metric}_ci_high"] = d["ci"]
    return out | chosen_fields(result)


def log_to_mlflow(result: dict, out: Path, trained: str | None = None) -> None:
    """Metrics under stable names (:func:`stable_metrics`), report and charts into the active
    (or ``MLFLOW_RUN_ID``) run."""
    import mlflow

    metrics = document_metrics if result.get("scored_as") == "documents" else stable_metrics
    with mlflow.start_run(nested=mlflow.active_run() is not None):
        for key, value, step in metrics(result, trained):
            mlflow.log_metric(key, value, step=step)
        mlflow.log_artifacts(str(out), artifact_path="benchmark")
