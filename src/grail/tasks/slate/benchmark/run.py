"""The slate task's benchmark (``grail benchmark``): baselines, models and checkpoints, API
models, the opinion task, report and charts; the task's ``benchmark`` part
(:data:`grail.tasks.PARTS`), which the benchmark stage calls.

Every system predicts one option per row and gives a choice distribution per row: the
baselines of :mod:`grail.tasks.slate.baselines` (those needing a train split say so when it is
missing), a random pick, the study's own choice model when the data came from ``grail simulate``
(the exact ceiling), and each ``--model`` (see :mod:`grail.inference.specs`; a training output
brings its starting model as step 0 and every checkpoint), whose answers are parsed by the accuracy
reward's parser. Each system is scored as a simulator of people: accuracy, log-loss of the
chosen video, Brier score, calibration error and the distance between its simulated and the
real chosen positions (and slants relative to the viewer), with 95% intervals from a bootstrap
over participants (a participant's steps are correlated); paired differences say whether
training helped. Writes ``metrics.json``, ``predictions.parquet``, ``report.md``,
``accuracy_by_model.svg`` and, when checkpoints were evaluated, ``accuracy_vs_step.svg`` and
``log_loss_vs_step.svg``; logs them to MLflow when ``MLFLOW_TRACKING_URI`` is set.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from grail.core import tracking
from grail.core.errors import GrailError
from grail.core.outputs import atomic_folder, check_writable, work_folder
from grail.inference.specs import run_markers, training_records
from grail.tasks.slate.benchmark import report
from grail.tasks.slate.benchmark.reads import ablated_rows
from grail.tasks.slate.benchmark.records import stable_metrics, write_predictions
from grail.tasks.slate.benchmark.scores import (
    chosen_checkpoint,
    differences,
    normalised_scores,
    opinion_table,
    score_system,
    win_rates,
)
from grail.tasks.slate.benchmark.systems import (
    load_slants,
    load_truth,
    model_systems,
    reference_systems,
    slant_sides,
    truth_choices,
)
from grail.tasks.slate.contract import read_dataset

logger = logging.getLogger(__name__)


def run(config, prompt: dict, label: str | None, trained: str | None, branch: dict | None) -> dict:
    """Benchmark the split; returns the metrics (also written to ``config.out/metrics.json``).

    `config`: the benchmark stage's settings (its ``BenchmarkConfig``). Each model is asked the
    way it was trained (its prompt.json) unless `prompt` names a setting (a
    :class:`~grail.tasks.slate.prompts.PromptOptions` field, by name). ``label`` names the data
    in the report. ``trained`` names the model (its series) this run is about: MLflow gets it
    as ``trained``, the other models as ``model/NAME``. ``branch`` (issue, algorithm) is
    recorded for the comparison of algorithms (:mod:`grail.tasks.slate.benchmark.compare`)."""
    split, limit, max_new_tokens = config.split, config.limit, config.max_new_tokens
    data, out = Path(config.data), Path(config.out)
    check_writable(out, "benchmark")  # before minutes of scoring, not after
    runs = run_markers(config.models)  # the runs scored, checked against their markers
    overrides = dict(prompt)
    if max_new_tokens is not None:
        overrides["max_new_tokens"] = max_new_tokens
    rows = read_dataset(data, split=split).to_pylist()[:limit]
    if not rows:
        raise GrailError(f"{data}: no rows in the {split} split")
    train = read_dataset(data, split="train").to_pylist() if split != "train" else []
    truth = load_truth(data, config.truth)
    asked_again = rows[: config.reads_rows] if config.reads_rows is not None else rows
    ablated = ablated_rows(asked_again) if asked_again else {}
    systems, skipped = reference_systems(rows, train, truth, ablated)
    logger.info("%s: %d %s rows; baselines and ceilings scored", data, len(rows), split)
    with work_folder("benchmark") as workdir:
        systems += model_systems(config.models, rows, overrides, config, Path(workdir), ablated)
    sides = slant_sides(rows, truth, load_slants(data, config.truth))
    choices = truth_choices(rows, truth)
    chosen = chosen_checkpoint(systems, rows, trained, config.bootstrap)
    result = {
        "task": config.task,
        "scored_as": "choices",
        "data": label or str(data),
        **({"branch": branch} if branch else {}),
        "trained": trained,
        "split": split,
        "rows": len(rows),
        "participants": len({r["participant_id"] for r in rows}),
        "intervals": f"95% percentile bootstrap over participants ({config.bootstrap} "
        "replicates, seed 0); opinion: Wilson (one row per participant)",
        "systems": {
            s.name: score_system(s, rows, sides, config.bootstrap, choices) for s in systems
        },
        "differences": differences(
            systems, rows, trained, config.bootstrap, choices, (chosen or {}).get("system")
        ),
        "chosen": chosen,
        "opinion": opinion_table(systems, rows, train),
        "win_rates": win_rates(systems, rows, config.references),
        "skipped": skipped,
        "training": training_records(config.models),
        "runs": runs,
    }
    normalised_scores(result["systems"])
    with atomic_folder(out, "benchmark") as staging:  # complete or absent, never mixed
        result["charts"] = ["accuracy_by_model.svg"] + [
            f"{metric}_vs_step.svg"
            for metric in ("accuracy", "log_loss")
            if report.chart_by_step(result, staging / f"{metric}_vs_step.svg", metric)
        ]
        report.chart_by_model(result, staging / "accuracy_by_model.svg")
        (staging / "metrics.json").write_text(json.dumps(result, indent=1) + "\n")
        write_predictions(staging / "predictions.parquet", systems, rows, choices)
        (staging / "report.md").write_text(report.benchmark_markdown(result))
    if tracking.enabled():
        tracking.log_nested_run(stable_metrics(result, trained), out, "benchmark")
    return result
