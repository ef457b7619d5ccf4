"""What the slate task's benchmark leaves: every prediction as a row (``predictions.parquet``),
the metrics under stable names (logged to MLflow by the benchmark stage) and the headline of a
trained model."""

from __future__ import annotations

from pathlib import Path

from grail.tasks.headline import CLONED, chosen_fields, role
from grail.tasks.slate import metrics as m
from grail.tasks.slate.baselines import BLIND_CEILING, EXPECTED_CEILING, ORACLE
from grail.tasks.slate.benchmark.reads import ABLATIONS
from grail.tasks.slate.benchmark.systems import READ_BY, System

# the ceilings under their metric ids (the study's own choice model knows them)
TRUTH_IDS = {EXPECTED_CEILING: "bayes_optimal", BLIND_CEILING: "position_blind", ORACLE: "oracle"}


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
    *(f"reads_{name}{part}" for name in ABLATIONS for part in ("", "_ci_low", "_ci_high")),
)
BY_STEP_FIELDS = ("accuracy", "log_loss", "expected_log_loss")


def stable_metrics(result: dict, trained: str | None = None) -> list[tuple[str, float, int]]:
    """(key, value, step) for MLflow: every system's accuracy, CI, parse rate and simulator
    scores under ``ROLE/FIELD`` (a model's last checkpoint, i.e. the final model), and each
    checkpoint's accuracy and log-loss as ``ROLE_by_step/FIELD`` (MLflow refuses "@" in names)
    at its step (step 0: the starting model)."""
    final: dict[str, dict] = {}
    out = []
    for name, entry in result["systems"].items():
        stem = role(name, entry, trained, TRUTH_IDS)
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


def benchmark_headline(result: dict, trained: str) -> dict:
    """The trained model against its references, for the pipeline run's summary: the final
    model's accuracy, CI and parse rate, the best checkpoint, the best baseline by accuracy and
    the best by log-loss (the one the paired difference ``final_minus_best_baseline`` is
    against), and the Bayes-optimal expectation when the data came from ``grail simulate``.
    """
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
    for name in READ_BY:  # whether the reference reads, beside the trained model's
        out |= {
            f"{name}_{k}": values[f"baseline/{name}/{k}"]
            for k in SUMMARY_FIELDS
            if k.startswith("reads_") and f"baseline/{name}/{k}" in values
        }
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
