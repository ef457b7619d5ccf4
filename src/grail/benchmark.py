"""Stage ``benchmark``: baselines, models and checkpoints, API models, opinion task, report, charts.

Run: ``grail benchmark --data data/ --out bench/ [--model SPEC ...] [--split validation]
[--limit N]``.

Every system predicts one option per row: the baselines of :mod:`grail.baselines` (those needing
a train split say so when it is missing), the expected accuracy of a random pick, the
Bayes-optimal ceiling when the data came from ``grail simulate``, and each ``--model`` (see
:mod:`grail.predict`), whose answers are parsed by the accuracy reward's parser. Writes
``metrics.json``, ``predictions.parquet``, ``report.md``, ``accuracy_by_model.svg`` and, when
checkpoints were evaluated, ``accuracy_vs_step.svg``; logs them to MLflow when
``MLFLOW_TRACKING_URI`` is set.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from grail import metrics as m
from grail import report
from grail.baselines import BASELINES, BLIND_CEILING, EXPECTED_CEILING, ORACLE, Skipped
from grail.config import option
from grail.contract import read_dataset
from grail.errors import GrailError
from grail.outputs import atomic_folder
from grail.predict import dry_run, expand_spec, generate_local, generate_openai
from grail.prompts import PromptOptions, shuffle_slate, to_example
from grail.rewards import parse_answer, parse_opinion

logger = logging.getLogger(__name__)


@dataclass
class System:
    """One row of the benchmark: a baseline, an expected value, or a model."""

    name: str
    kind: str  # "expected", "baseline" or "model"
    predictions: list[int | None] | None = None  # 1-based, in the displayed order
    probabilities: list[float] | None = None  # for "expected": P(hit) per row
    completions: list[str | None] | None = None
    opinions: list[str | None] | None = None
    step: int | None = None
    series: str | None = None
    seconds: float = 0.0
    metrics: dict = field(default_factory=dict)
    prompt: dict | None = None  # models: how they were asked (PromptOptions + max_new_tokens)


def group_key(row: dict) -> str:
    return f"{row['issue']}/{row['study']}"


def load_truth(data: Path, truth: str | None) -> dict[tuple[str, int], dict] | None:
    """Per (session_id, step_index), from ``truth_steps.csv``: the Bayes-optimal hit
    probability, the choice model's most likely pick and the position-blind hit probability."""
    path = Path(truth) if truth else (data if data.is_dir() else data.parent) / "truth_steps.csv"
    if not path.is_file():
        if truth:
            raise GrailError(f"{truth}: truth file not found")
        return None
    with path.open() as handle:
        return {
            (r["session_id"], int(r["step_index"])): {
                "bayes": float(r["bayes_probability"]),
                "best_id": r.get("bayes_best_id"),
                "blind": float(r["blind_probability"]) if r.get("blind_probability") else None,
            }
            for r in csv.DictReader(handle)
        }


def truth_systems(rows: list[dict], truth) -> tuple[list[System], dict]:
    """What the study's own choice model says, when the data came from ``grail simulate``.

    - ``bayes_optimal (expected)``: the mean hit probability of always picking the most likely
      option, the viewer's hidden stance known: an expectation, not a bound (a real predictor
      can beat it on a small sample by luck);
    - ``oracle``: that pick as a real predictor, scored against what people clicked (with a CI);
    - ``position_blind (expected)``: the best expectation when display positions are hidden
      (options shuffled): the reference for a model trained and asked with shuffled slates.
    """
    if truth is None:
        return [], {}
    known = [truth.get((r["session_id"], r["step_index"])) for r in rows]
    if any(k is None for k in known):
        return [], {EXPECTED_CEILING: "truth_steps.csv does not cover these rows"}
    systems = [System(EXPECTED_CEILING, "expected", probabilities=[k["bayes"] for k in known])]
    if all(k["best_id"] for k in known):
        picks = [
            next((j + 1 for j, item in enumerate(r["slate"]) if item["id"] == k["best_id"]), None)
            for r, k in zip(rows, known, strict=True)
        ]
        systems.append(System(ORACLE, "baseline", predictions=picks))
    if all(k["blind"] is not None for k in known):
        systems.append(System(BLIND_CEILING, "expected", probabilities=[k["blind"] for k in known]))
    return systems, {}


def reference_systems(rows: list[dict], train: list[dict], truth) -> tuple[list[System], dict]:
    """Expected random, what the truth file knows, and every baseline; skipped ones with reasons."""
    systems = [
        System("random (expected)", "expected", probabilities=[1 / r["n_options"] for r in rows])
    ]
    known, skipped = truth_systems(rows, truth)
    systems += known
    for name, baseline in BASELINES.items():
        started = time.perf_counter()
        try:
            predictions = baseline(train, rows)
        except Skipped as reason:
            skipped[name] = str(reason)
            continue
        systems.append(
            System(name, "baseline", predictions=predictions, seconds=time.perf_counter() - started)
        )
    return systems, skipped


PROMPT_DEFAULTS = asdict(PromptOptions()) | {"max_new_tokens": 128}


def trained_prompt(spec) -> dict:
    """How a local model was trained to be asked (``prompt.json`` in its folder, or in the
    training output a checkpoint belongs to); {} when unknown (API models, foreign models)."""
    if spec.kind != "local":
        return {}
    for folder in (Path(spec.path), Path(spec.path).parent):
        if (folder / "prompt.json").is_file():
            return json.loads((folder / "prompt.json").read_text())
    return {}


def prompt_for(spec, overrides: dict) -> dict:
    """The model's own prompt settings, then the ones given explicitly, then the defaults.

    >>> from grail.predict import ModelSpec
    >>> prompt_for(ModelSpec("api", "openai"), {"history_depth": 3})["history_depth"]
    3
    """
    known = {k: v for k, v in trained_prompt(spec).items() if k in PROMPT_DEFAULTS}
    return PROMPT_DEFAULTS | known | overrides


def ask(rows: list[dict], prompt: dict) -> tuple[list[dict], list[list[dict]]]:
    """The rows as shown (options shuffled when the prompt shuffles) and their conversations."""
    seed = prompt["shuffle_seed"]
    presented = [shuffle_slate(r, seed) if seed is not None else r for r in rows]
    plain = PromptOptions(
        prompt["history_depth"],
        prompt["show_ids"],
        None,
        prompt["opinion"],
        prompt.get("system_prompt"),
    )
    return presented, [to_example(r, plain)["prompt"] for r in presented]


def model_systems(
    specs: list[str], rows: list[dict], overrides: dict, config: BenchmarkConfig, workdir: Path
) -> list[System]:
    """Evaluate every model the specs name, each asked the way it was trained unless
    `overrides` say otherwise; answers mapped back to the displayed order."""
    systems = []
    for spec in (s for text in specs for s in expand_spec(text, workdir)):
        prompt = prompt_for(spec, overrides)
        presented, conversations = ask(rows, prompt)
        tokens = prompt["max_new_tokens"]
        started = time.perf_counter()
        logger.info("%s: asking %d questions", spec.name, len(rows))
        if spec.kind == "openai" and config.dry_run:
            print(dry_run(spec, conversations, tokens))
            continue
        if spec.kind == "openai":
            completions = generate_openai(spec, conversations, tokens, config.concurrency)
        else:
            completions = generate_local(
                spec.path, conversations, tokens, config.batch_size, config.backend
            )
        predictions = []
        for row, shown, text in zip(rows, presented, completions, strict=True):
            answer = parse_answer(text or "", row["n_options"])
            chosen = shown["slate"][answer - 1]["id"] if answer else None
            predictions.append(
                next((j + 1 for j, item in enumerate(row["slate"]) if item["id"] == chosen), None)
            )
        opinions = [parse_opinion(t or "") for t in completions] if prompt["opinion"] else None
        systems.append(
            System(
                spec.name,
                "model",
                predictions=predictions,
                completions=completions,
                opinions=opinions,
                step=spec.step,
                series=spec.series,
                seconds=time.perf_counter() - started,
                prompt=prompt,
            )
        )
        logger.info("%s: answered in %.0f s", spec.name, systems[-1].seconds)
    return systems


def score(system: System, rows: list[dict]) -> dict:
    """Accuracy (overall and per issue/study), parse rate and the predicted-position histogram."""
    groups = sorted({group_key(r) for r in rows})
    if system.kind == "expected":
        overall = m.expected_accuracy(system.probabilities)
        by_group = {
            g: m.expected_accuracy(
                [p for p, r in zip(system.probabilities, rows, strict=True) if group_key(r) == g]
            )
            for g in groups
        }
        return {"kind": system.kind, **overall, "by_group": by_group}
    gold = [r["gold_index"] for r in rows]
    by_group = {}
    for g in groups:
        picked = [
            (p, r["gold_index"])
            for p, r in zip(system.predictions, rows, strict=True)
            if group_key(r) == g
        ]
        by_group[g] = m.accuracy([p for p, _ in picked], [y for _, y in picked])
    return {
        "kind": system.kind,
        **m.accuracy(system.predictions, gold),
        "by_group": by_group,
        "positions": m.position_histogram(system.predictions),
        "seconds": round(system.seconds, 3),
        **({"step": system.step, "series": system.series} if system.step is not None else {}),
        **({"prompt": system.prompt} if system.prompt is not None else {}),
    }


def last_steps(rows: list[dict]) -> list[int]:
    """Index of each participant's last evaluated step: opinions are one label per person, so
    they are scored once per person (every step row repeats its participant's label).

    >>> last_steps([{"participant_id": "a", "step_index": 0}, {"participant_id": "b",
    ...   "step_index": 0}, {"participant_id": "a", "step_index": 1}])
    [1, 2]
    """
    last: dict[str, int] = {}
    for k, row in enumerate(rows):
        seen = last.get(row["participant_id"])
        if seen is None or row["step_index"] >= rows[seen]["step_index"]:
            last[row["participant_id"]] = k
    return sorted(last.values())


def opinion_table(systems: list[System], rows: list[dict], train: list[dict]) -> dict:
    """Opinion-direction metrics per participant (their last evaluated step) for models asked
    about it, with the no-change and majority-direction baselines."""
    people = [rows[k] for k in last_steps(rows)]
    labels = [r["opinion_direction"] for r in people]
    if not any(labels):
        return {}
    shift = {}
    trained_people = [train[k] for k in last_steps(train)] if train else []
    for direction in m.DIRECTION_SIGN:
        changes = [
            r["opinion_after"] - r["opinion_before"]
            for r in trained_people
            if r["opinion_direction"] == direction
        ]
        shift[direction] = sum(changes) / len(changes) if changes else 0.0
    before = [r["opinion_before"] for r in people]
    after = [r["opinion_after"] for r in people]
    table = {
        "no change": m.opinion_metrics(["no_change"] * len(people), labels, before, after, shift)
    }
    majority = Counter(r["opinion_direction"] for r in trained_people if r["opinion_direction"])
    if majority:
        top = majority.most_common(1)[0][0]
        table[f"majority direction ({top})"] = m.opinion_metrics(
            [top] * len(people), labels, before, after, shift
        )
    index = last_steps(rows)
    for system in systems:
        if system.opinions is not None:
            predicted = [system.opinions[k] for k in index]
            table[system.name] = m.opinion_metrics(predicted, labels, before, after, shift)
    return table


def win_rates(systems: list[System], rows: list[dict], references: list[str] | None) -> dict:
    """Pairwise win rate of every predicting system against each reference system."""
    gold = [r["gold_index"] for r in rows]
    predicting = {s.name: s for s in systems if s.predictions is not None}
    chosen = references or list(predicting)
    missing = [name for name in chosen if name not in predicting]
    if missing:
        raise GrailError(
            f"--reference {missing[0]!r} is not a system in this benchmark "
            f"(one of: {', '.join(predicting)})"
        )
    return {
        name: {
            ref: m.win_rate(s.predictions, predicting[ref].predictions, gold)
            for ref in chosen
            if ref != name
        }
        for name, s in predicting.items()
    }


def write_predictions(path: Path, systems: list[System], rows: list[dict]) -> None:
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
                    "step": s.step,
                    "session_id": row["session_id"],
                    "step_index": row["step_index"],
                    "issue": row["issue"],
                    "study": row["study"],
                    "gold_index": row["gold_index"],
                    "predicted_index": predicted,
                    "correct": predicted == row["gold_index"],
                    "completion": s.completions[k] if s.completions else None,
                    "opinion": s.opinions[k] if s.opinions else None,
                }
            )
    pq.write_table(pa.Table.from_pylist(records), path)


TRUTH_IDS = {EXPECTED_CEILING: "bayes_optimal", BLIND_CEILING: "position_blind", ORACLE: "oracle"}
SUMMARY_FIELDS = ("accuracy", "ci_low", "ci_high", "parse_rate")


def identifier(name: str) -> str:
    """A system's name as a metric-key part: no spaces, no parenthesised remark.

    >>> identifier("random (expected)"), identifier("Qwen/Qwen2.5-1.5B-Instruct@host:8000")
    ('random', 'Qwen_Qwen2.5-1.5B-Instruct_host_8000')
    """
    return re.sub(r"[^\w\-.]+", "_", name.split(" (")[0]).strip("_")


def role(name: str, entry: dict, trained: str | None) -> str:
    """What a system is, as the stem of its metric keys: ``trained`` (the model this run
    trained), ``baseline/ID``, ``ceiling/ID`` (what the study's own choice model knows) or
    ``model/ID`` (a reference model). Stable across runs and algorithms, so MLflow compares them.
    """
    series = entry.get("series") or name
    if trained is not None and series == trained:
        return "trained"
    if name in TRUTH_IDS:
        return f"ceiling/{TRUTH_IDS[name]}"
    if entry["kind"] in ("baseline", "expected"):
        return f"baseline/{identifier(name)}"
    return f"model/{identifier(series)}"


def stable_metrics(result: dict, trained: str | None = None) -> list[tuple[str, float, int]]:
    """(key, value, step) for MLflow: every system's accuracy, CI and parse rate under
    ``ROLE/FIELD`` (a model's last checkpoint, i.e. the final model), and each checkpoint's
    accuracy as ``ROLE_by_step/accuracy`` (MLflow refuses "@" in names) at its step."""
    final: dict[str, dict] = {}
    out = []
    for name, entry in result["systems"].items():
        stem = role(name, entry, trained)
        if entry.get("step") is not None:
            out.append((f"{stem}_by_step/accuracy", entry["accuracy"], entry["step"]))
        if stem not in final or (entry.get("step") or -1) >= (final[stem].get("step") or -1):
            final[stem] = entry
    for stem, entry in final.items():
        out += [(f"{stem}/{k}", entry[k], 0) for k in SUMMARY_FIELDS if entry.get(k) is not None]
    return out


def headline(result: dict, trained: str) -> dict:
    """The trained model against its references, for the pipeline run's summary: the final
    model's accuracy, CI and parse rate, the best checkpoint, the best baseline (by name) and
    the Bayes-optimal expectation when the data came from ``grail simulate``."""
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
    return out


def log_to_mlflow(result: dict, out: Path, trained: str | None = None) -> None:
    """Metrics under stable names (:func:`stable_metrics`), report and charts into the active
    (or ``MLFLOW_RUN_ID``) run."""
    import mlflow

    with mlflow.start_run(nested=mlflow.active_run() is not None):
        for key, value, step in stable_metrics(result, trained):
            mlflow.log_metric(key, value, step=step)
        mlflow.log_artifacts(str(out), artifact_path="benchmark")


@dataclass(kw_only=True)
class BenchmarkConfig:
    """grail benchmark: baselines, ceilings and models on a split; report, charts, metrics.

    Each model is asked the way it was trained (its prompt.json): a prompt option given here
    (or in a recipe) overrides that for every model."""

    data: str = option("Cleaned folder or parquet file.")
    out: str = option("Output folder.")
    models: list[str] = option(
        "Model folder, training output, checkpoint URI (s3://, file://), openai:NAME@URL or "
        "openai:NAME; repeatable.",
        [],
        aliases=["--model"],
        action="extend",
        metavar="SPEC",
    )
    split: str = option("Split to evaluate.", "validation")
    limit: int | None = option("Evaluate the first N rows.", None)
    references: list[str] | None = option(
        "Systems to compute win rates against (default: all); repeatable.",
        None,
        aliases=["--reference"],
        action="extend",
        metavar="NAME",
    )
    truth: str | None = option("truth_steps.csv for the ceiling (default: next to the data).", None)
    max_new_tokens: int | None = option(
        "Tokens per answer (default: the model's max_completion_length, else 128).", None
    )
    batch_size: int = option("Local generation batch size.", 16)
    backend: Literal["auto", "transformers", "vllm"] = option(
        "Local models: vLLM where a GPU and vllm are present (auto), else transformers.", "auto"
    )
    concurrency: int = option("Parallel API requests.", 8)
    dry_run: bool = option("Print what API models would be sent; send nothing.", False)

    def __post_init__(self):
        if self.limit is not None and self.limit < 1:
            raise GrailError(f"limit: expected a whole number of at least 1, got {self.limit}")


def run(
    data: str | Path,
    out: str | Path,
    options: PromptOptions | None = None,
    prompt: dict | None = None,
    label: str | None = None,
    trained: str | None = None,
    **settings,
) -> dict:
    """Run the stage; returns the metrics (also written to ``out/metrics.json``).

    `settings`: the other :class:`BenchmarkConfig` fields. ``options`` overrides every prompt
    setting, ``prompt`` the ones it names. ``label`` names the data in the report. ``trained``
    names the model (its series) this run is about: MLflow gets it as ``trained``, the other
    models as ``model/NAME``."""
    config = BenchmarkConfig(data=str(data), out=str(out), **settings)
    split, limit, max_new_tokens = config.split, config.limit, config.max_new_tokens
    data, out = Path(data), Path(out)
    # Each model is asked the way it was trained (its prompt.json) unless told otherwise:
    # `options` overrides every prompt setting, `prompt` the ones it names.
    overrides = dict(prompt or {}) | (asdict(options) if options is not None else {})
    if max_new_tokens is not None:
        overrides["max_new_tokens"] = max_new_tokens
    rows = read_dataset(data, split=split).to_pylist()[:limit]
    if not rows:
        raise GrailError(f"{data}: no rows in the {split} split")
    train = read_dataset(data, split="train").to_pylist() if split != "train" else []
    systems, skipped = reference_systems(rows, train, load_truth(data, config.truth))
    logger.info("%s: %d %s rows; baselines and ceilings scored", data, len(rows), split)
    with tempfile.TemporaryDirectory(prefix="grail-benchmark-") as workdir:
        systems += model_systems(config.models, rows, overrides, config, Path(workdir))
    result = {
        "data": label or str(data),
        "split": split,
        "rows": len(rows),
        "systems": {s.name: score(s, rows) for s in systems},
        "opinion": opinion_table(systems, rows, train),
        "win_rates": win_rates(systems, rows, config.references),
        "skipped": skipped,
    }
    with atomic_folder(out, "benchmark") as staging:  # complete or absent, never mixed
        result["charts"] = ["accuracy_by_model.svg"] + (
            ["accuracy_vs_step.svg"]
            if report.chart_by_step(result, staging / "accuracy_vs_step.svg")
            else []
        )
        report.chart_by_model(result, staging / "accuracy_by_model.svg")
        (staging / "metrics.json").write_text(json.dumps(result, indent=1) + "\n")
        write_predictions(staging / "predictions.parquet", systems, rows)
        (staging / "report.md").write_text(report.benchmark_markdown(result))
    if os.environ.get("MLFLOW_TRACKING_URI"):
        log_to_mlflow(result, out, trained)
    return result
