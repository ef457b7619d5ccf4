"""Stage ``benchmark``: baselines, models and checkpoints, API models, opinion task, report, charts.

Run: ``grail benchmark --data data/ --out results/ [--model SPEC ...] [--split validation]
[--limit N]``.

Every system predicts one option per row and gives a choice distribution per row: the
baselines of :mod:`grail.benchmark.baselines` (those needing a train split say so when it is
missing), a random pick, the study's own choice model when the data came from ``grail simulate``
(the exact ceiling), and each ``--model`` (see :mod:`grail.benchmark.predict`; a training output
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

import csv
import json
import logging
import re
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from grail.benchmark import metrics as m
from grail.benchmark import report
from grail.benchmark.baselines import BASELINES, BLIND_CEILING, EXPECTED_CEILING, ORACLE, Skipped
from grail.benchmark.config import BenchmarkConfig
from grail.benchmark.predict import answer_local, answer_openai, dry_run, expand_spec
from grail.core import bootstrap, tracking
from grail.core.contract import read_dataset
from grail.core.errors import GrailError
from grail.core.outputs import atomic_folder
from grail.core.prompts import PromptOptions, shuffle_slate, to_example
from grail.core.rewards import parse_answer, parse_opinion

logger = logging.getLogger(__name__)


@dataclass
class System:
    """One row of the benchmark: a baseline, an expected value, or a model."""

    name: str
    kind: str  # "expected", "baseline" or "model"
    predictions: list[int | None] | None = None  # 1-based, in the displayed order
    probabilities: list[float] | None = None  # for "expected": P(hit) per row
    distributions: list[list[float]] | None = None  # choice distribution per row, displayed order
    method: str | None = None  # how a model's distributions were obtained
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
    probability, the choice model's most likely pick, the position-blind hit probability, and
    (studies simulated since they were recorded) the viewer's hidden stance and the choice
    model's probability of each option by video id."""
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
                "stance": float(r["stance"]) if r.get("stance") else None,
                "choice": json.loads(r["choice_probabilities"])
                if r.get("choice_probabilities")
                else None,
            }
            for r in csv.DictReader(handle)
        }


def load_slants(data: Path, truth: str | None) -> dict[str, float]:
    """Each video's slant from ``truth.json`` beside the truth file ({} when absent)."""
    folder = Path(truth).parent if truth else (data if data.is_dir() else data.parent)
    path = folder / "truth.json"
    return json.loads(path.read_text()).get("video_slant", {}) if path.is_file() else {}


def slant_sides(rows: list[dict], truth, slants: dict[str, float]) -> list[list[str]] | None:
    """Each option's slant relative to the viewer's hidden stance (``toward``, ``against`` or
    ``neutral``), per row, when the study's truth knows both; else None.

    >>> truth = {("s", 0): {"stance": -0.4}}
    >>> slant_sides([{"session_id": "s", "step_index": 0, "slate": [{"id": "a"}, {"id": "b"}]}],
    ...     truth, {"a": -1.0, "b": 0.0})
    [['toward', 'neutral']]
    """
    if not truth or not slants:
        return None
    sides = []
    for row in rows:
        stance = (truth.get((row["session_id"], row["step_index"])) or {}).get("stance")
        if stance is None or any(item["id"] not in slants for item in row["slate"]):
            return None
        sides.append(
            [
                "toward" if v > 0 else "against" if v < 0 else "neutral"
                for v in (stance * slants[item["id"]] for item in row["slate"])
            ]
        )
    return sides


def truth_choices(rows: list[dict], truth) -> list[list[float]] | None:
    """The choice model's probability of each option per row, in displayed order, when the
    truth file knows every row (studies simulated since it records them); else None."""
    if truth is None:
        return None
    known = [truth.get((r["session_id"], r["step_index"])) for r in rows]
    if any(k is None or not k["choice"] for k in known):
        return None
    return [
        [k["choice"][item["id"]] for item in r["slate"]] for r, k in zip(rows, known, strict=True)
    ]


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
    choices = truth_choices(rows, truth)
    systems = [
        System(
            EXPECTED_CEILING,
            "expected",
            probabilities=[k["bayes"] for k in known],
            distributions=choices,
        )
    ]
    if all(k["best_id"] for k in known):
        picks = [
            next((j + 1 for j, item in enumerate(r["slate"]) if item["id"] == k["best_id"]), None)
            for r, k in zip(rows, known, strict=True)
        ]
        systems.append(System(ORACLE, "baseline", predictions=picks, distributions=choices))
    if all(k["blind"] is not None for k in known):
        systems.append(System(BLIND_CEILING, "expected", probabilities=[k["blind"] for k in known]))
    return systems, {}


def reference_systems(rows: list[dict], train: list[dict], truth) -> tuple[list[System], dict]:
    """Expected random, what the truth file knows, and every baseline; skipped ones with reasons."""
    uniform = [[1 / r["n_options"]] * r["n_options"] for r in rows]
    systems = [
        System(
            "random (expected)",
            "expected",
            probabilities=[1 / r["n_options"] for r in rows],
            distributions=uniform,
        )
    ]
    known, skipped = truth_systems(rows, truth)
    systems += known
    for name, baseline in BASELINES.items():
        started = time.perf_counter()
        try:
            guesses = baseline(train, rows)
        except Skipped as reason:
            skipped[name] = str(reason)
            continue
        systems.append(
            System(
                name,
                "baseline",
                predictions=guesses.predictions,
                distributions=guesses.distributions,
                seconds=time.perf_counter() - started,
            )
        )
    return systems, skipped


PROMPT_DEFAULTS = asdict(PromptOptions()) | {"max_new_tokens": 128}


def trained_prompt(spec) -> dict:
    """How a local model was trained to be asked (``prompt.json`` in its folder, or in the
    training output a checkpoint belongs to); {} when unknown (API models, foreign models)."""
    if spec.kind != "local":
        return {}
    if spec.asked_as:  # a starting model is asked the way its training run asks
        return trained_prompt(replace(spec, path=spec.asked_as, asked_as=None))
    for folder in (Path(spec.path), Path(spec.path).parent):
        if (folder / "prompt.json").is_file():
            return json.loads((folder / "prompt.json").read_text())
    return {}


def prompt_for(spec, overrides: dict) -> dict:
    """The model's own prompt settings, then the ones given explicitly, then the defaults.

    >>> from grail.core.serving import ModelSpec
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
    starts = [config.start_model] + [None] * (len(specs) - 1)  # of the first (trained) model
    expanded = [
        s
        for text, start in zip(specs, starts, strict=False)
        for s in expand_spec(text, workdir, start)
    ]
    # One local model asked one way is answered once, under every name it has (the start of
    # two runs, or a run's last checkpoint beside its final folder): greedy answers are the same.
    answered: dict[tuple, object] = {}
    for spec in expanded:
        prompt = prompt_for(spec, overrides)
        presented, conversations = ask(rows, prompt)
        tokens = prompt["max_new_tokens"]
        started = time.perf_counter()
        logger.info("%s: asking %d questions", spec.name, len(rows))
        if spec.kind == "openai" and config.dry_run:
            print(dry_run(spec, conversations, tokens))
            continue
        options = [r["n_options"] for r in rows]
        if spec.kind == "openai":
            answers = answer_openai(
                spec, conversations, options, tokens, config.concurrency, config.samples
            )
        else:
            key = (str(Path(spec.path).resolve()), json.dumps(prompt, sort_keys=True))
            if key not in answered:
                answered[key] = answer_local(
                    spec.path, conversations, options, tokens, config.batch_size, config.backend
                )
            else:
                logger.info("%s: the same model asked the same way as before", spec.name)
            answers = answered[key]
        completions = answers.completions
        predictions, distributions = [], []
        for row, shown, text, shares in zip(
            rows, presented, completions, answers.distributions, strict=True
        ):
            answer = parse_answer(text or "", row["n_options"])
            chosen = shown["slate"][answer - 1]["id"] if answer else None
            predictions.append(
                next((j + 1 for j, item in enumerate(row["slate"]) if item["id"] == chosen), None)
            )
            by_id = {item["id"]: p for item, p in zip(shown["slate"], shares, strict=True)}
            distributions.append([by_id[item["id"]] for item in row["slate"]])
        opinions = [parse_opinion(t or "") for t in completions] if prompt["opinion"] else None
        systems.append(
            System(
                spec.name,
                "model",
                predictions=predictions,
                distributions=distributions,
                method=answers.method,
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


def accuracy_scores(system: System, rows: list[dict], replicates: int) -> dict:
    """Accuracy (or a known expectation of it) and parse rate, with a participant-bootstrap
    interval: a participant's steps are correlated, so participants are resampled, not rows."""
    import numpy as np

    people = [r["participant_id"] for r in rows]
    if system.kind == "expected":
        hits, entry = (
            np.array(system.probabilities, dtype=float),
            m.expected_accuracy(system.probabilities),
        )
    else:
        gold = [r["gold_index"] for r in rows]
        hits = np.array([p == g for p, g in zip(system.predictions, gold, strict=True)], float)
        entry = m.accuracy(system.predictions, gold)
    if len(rows):
        low, high = bootstrap.participant_bootstrap(
            bootstrap.mean_statistic(hits), people, replicates
        )
        entry["ci_low"], entry["ci_high"] = round(low, 4), round(high, 4)
    return entry


def simulator_scores(
    system: System,
    rows: list[dict],
    sides: list[list[str]] | None,
    replicates: int,
    choices: list[list[float]] | None = None,
) -> dict:
    """How likely the system finds what people did (log-loss, Brier), its calibration (ECE),
    the distance between its simulated and the people's chosen positions (``position_tv``) and,
    when the study's truth is known, chosen slants relative to the viewer (``slant_tv``); each
    with a participant-bootstrap interval. When the study's choice model is known
    (`choices`), also ``expected_log_loss``: the log-loss expected under the true choice
    probabilities of each row, the same quantity without the noise of which option each person
    happened to click. The choice model's own expectation (the ceiling) gets its exact
    expected log-loss and Brier instead."""
    import numpy as np

    if system.distributions is None or not rows:
        return {}
    people = [r["participant_id"] for r in rows]
    if system.kind == "expected":  # exact expectations: no sampling of the person's choice
        out = {}
        for name, per_row in (
            ("log_loss", [m.expected_log_loss(d) for d in system.distributions]),
            ("brier", [m.expected_brier(d) for d in system.distributions]),
        ):
            values = np.array(per_row)
            low, high = bootstrap.participant_bootstrap(
                bootstrap.mean_statistic(values), people, replicates
            )
            out[name], out[f"{name}_ci"] = round(values.mean(), 4), [round(low, 4), round(high, 4)]
        # its log-loss is already the expectation under the choice model: the same column
        out["expected_log_loss"], out["expected_log_loss_ci"] = out["log_loss"], out["log_loss_ci"]
        return out
    golds = [r["gold_index"] for r in rows]
    out = m.simulator_scores(system.distributions, golds, people, replicates, truths=choices)
    if sides is not None:
        out |= slant_distance(system.distributions, golds, sides, people, replicates)
    return out


def slant_distance(distributions, golds, sides, people, replicates: int) -> dict:
    """Total variation between the simulated and the real shares of chosen slants relative
    to the viewer's stance (toward, against, neutral), with a participant-bootstrap interval."""
    import numpy as np

    labels = ("toward", "against", "neutral")
    simulated = np.array(
        [
            [sum(p for p, s in zip(d, row, strict=True) if s == b) for b in labels]
            for d, row in zip(distributions, sides, strict=True)
        ]
    )
    real = np.array(
        [[float(row[g - 1] == b) for b in labels] for g, row in zip(golds, sides, strict=True)]
    )
    distance = m.share_distance(simulated, real)
    low, high = bootstrap.participant_bootstrap(distance, people, replicates)
    return {
        "slant_tv": round(distance(np.arange(len(golds))), 4),
        "slant_tv_ci": [round(low, 4), round(high, 4)],
    }


COLLAPSE_SHARE = 0.8


def collapse(entry: dict) -> str | None:
    """A one-line flag when a model's answers collapse onto one option: more than 80% of its
    simulated choices (its choice distribution) on one display position people chose less
    often than that, or more than 80% of its top-1 answers on an option that is not the one
    people choose most. Top-1 answers all on people's commonest option are what a model that
    learned the position prior gives (always-first's picks), not a collapse; its choice
    distribution tells. None when nothing collapsed.

    >>> collapse({"n": 100, "positions": {"3": 99, "1": 1}, "top_share": 0.4,
    ...     "top_position": 3, "human_shares": {"1": 0.45, "3": 0.13}})
    'answers option 3 on 99% of rows (people: 13%)'
    >>> collapse({"n": 100, "positions": {"1": 100}, "top_share": 0.97,
    ...     "top_position": 1, "human_shares": {"1": 0.45, "3": 0.13}})
    'puts 97% of its simulated choices on option 1 (people: 45%)'
    >>> collapse({"n": 100, "positions": {"1": 100}, "top_share": 0.42,
    ...     "top_position": 1, "human_shares": {"1": 0.45, "3": 0.13}}) is None
    True
    """
    human = entry.get("human_shares") or {}
    if entry.get("top_share") is not None and entry["top_share"] > COLLAPSE_SHARE:
        position = str(entry["top_position"])
        people = human.get(position, 0.0)
        if people <= COLLAPSE_SHARE:
            return (
                f"puts {entry['top_share']:.0%} of its simulated choices on option {position} "
                f"(people: {people:.0%})"
            )
    picks = {k: v for k, v in (entry.get("positions") or {}).items() if k != "none"}
    if picks and entry.get("n"):
        top = max(picks, key=picks.get)
        share, people = picks[top] / entry["n"], human.get(top, 0.0)
        commonest = max(human, key=human.get) if human else None
        if share > COLLAPSE_SHARE and top != commonest and people <= COLLAPSE_SHARE:
            return f"answers option {top} on {share:.0%} of rows (people: {people:.0%})"
    return None


def score_rows(system: System, rows: list[dict], sides, replicates: int, choices=None) -> dict:
    """Accuracy and simulator scores of a system on some rows."""
    return accuracy_scores(system, rows, replicates) | simulator_scores(
        system, rows, sides, replicates, choices
    )


def score_system(
    system: System,
    rows: list[dict],
    sides: list[list[str]] | None = None,
    replicates: int = 1000,
    choices: list[list[float]] | None = None,
) -> dict:
    """Accuracy and simulator scores (overall and per issue/study) with participant-bootstrap
    intervals, parse rate, the predicted-position histogram and a collapse flag."""
    groups = sorted({group_key(r) for r in rows})
    overall = score_rows(system, rows, sides, replicates, choices)
    by_group = {groups[0]: overall} if len(groups) == 1 else {}
    for g in groups if len(groups) > 1 else ():
        index = [k for k, r in enumerate(rows) if group_key(r) == g]
        part = System(
            system.name,
            system.kind,
            predictions=[system.predictions[k] for k in index] if system.predictions else None,
            probabilities=[system.probabilities[k] for k in index]
            if system.probabilities
            else None,
            distributions=[system.distributions[k] for k in index]
            if system.distributions
            else None,
        )
        by_group[g] = score_rows(
            part,
            [rows[k] for k in index],
            [sides[k] for k in index] if sides else None,
            replicates,
            [choices[k] for k in index] if choices else None,
        )
    entry = {"kind": system.kind, **overall, "by_group": by_group}
    if system.kind == "expected":
        return entry
    entry["positions"] = m.position_histogram(system.predictions)
    entry["human_shares"] = {
        str(k): round(sum(r["gold_index"] == k for r in rows) / len(rows), 4)
        for k in sorted({r["gold_index"] for r in rows})
    }
    flag = collapse(entry) if system.kind == "model" else None
    return entry | {
        "seconds": round(system.seconds, 3),
        **({"collapsed": flag} if flag else {}),
        **({"method": system.method} if system.method else {}),
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
)
BY_STEP_FIELDS = ("accuracy", "log_loss", "expected_log_loss")


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


def benchmark_headline(result: dict, trained: str) -> dict:
    """The trained model against its references, for the pipeline run's summary: the final
    model's accuracy, CI and parse rate, the best checkpoint, the best baseline by accuracy and
    the best by log-loss (the one the paired difference ``final_minus_best_baseline`` is
    against), and the Bayes-optimal expectation when the data came from ``grail simulate``."""
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
    against = (result.get("differences") or {}).get("final_minus_best_baseline") or {}
    by_log_loss = next((d["against"] for d in against.values() if d.get("against")), None)
    if by_log_loss and f"baseline/{by_log_loss}/log_loss" in values:
        out["best_log_loss_baseline"] = by_log_loss
        out["best_log_loss_baseline_log_loss"] = values[f"baseline/{by_log_loss}/log_loss"]
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
    return out


def per_row(system: System, rows: list[dict], choices=None) -> dict[str, list[float]]:
    """A system's per-row correctness and (with a choice distribution) log-loss, and its
    expected log-loss when the study's choice model is known (`choices`)."""
    out = {}
    if system.predictions is not None:
        gold = [r["gold_index"] for r in rows]
        out["accuracy"] = [float(p == g) for p, g in zip(system.predictions, gold, strict=True)]
    if system.distributions is not None and system.kind != "expected":
        out["log_loss"] = [
            m.row_log_loss(d, r["gold_index"])
            for d, r in zip(system.distributions, rows, strict=True)
        ]
        if choices is not None:
            out["expected_log_loss"] = [
                m.cross_entropy(t, d) for t, d in zip(choices, system.distributions, strict=True)
            ]
    return out


def differences(
    systems: list[System],
    rows: list[dict],
    trained: str | None,
    replicates: int,
    choices: list[list[float]] | None = None,
) -> dict:
    """Paired differences with participant-bootstrap intervals: the trained model's final step
    minus its step 0 (``final_minus_start``), and minus the best baseline by log-loss
    (``final_minus_best_baseline``, named in ``best_baseline``)."""
    series = [s for s in systems if s.kind == "model" and (s.series or s.name) == trained]
    if not series:
        return {}
    final = max(series, key=lambda s: s.step or 0)
    start = next((s for s in series if s.step == 0), None)
    baselines = [
        s for s in systems if s.kind == "baseline" and s.name != ORACLE and s.distributions
    ]
    people = [r["participant_id"] for r in rows]
    ours = per_row(final, rows, choices)
    out = {}
    best = min(baselines, key=lambda s: sum(per_row(s, rows)["log_loss"]), default=None)
    for label, other in (("final_minus_start", start), ("final_minus_best_baseline", best)):
        if other is None or other is final:
            continue
        theirs = per_row(other, rows, choices)
        out[label] = {
            metric: bootstrap.paired_difference(ours[metric], theirs[metric], people, replicates)
            | {"against": other.name}
            for metric in ours
            if metric in theirs
        }
    return out


def log_to_mlflow(result: dict, out: Path, trained: str | None = None) -> None:
    """Metrics under stable names (:func:`stable_metrics`), report and charts into the active
    (or ``MLFLOW_RUN_ID``) run."""
    import mlflow

    with mlflow.start_run(nested=mlflow.active_run() is not None):
        for key, value, step in stable_metrics(result, trained):
            mlflow.log_metric(key, value, step=step)
        mlflow.log_artifacts(str(out), artifact_path="benchmark")


def summarize_run(config: BenchmarkConfig, label: str | None) -> dict:
    """The summarize task's benchmark (:mod:`grail.benchmark.documents`) with these settings."""
    from grail.benchmark.documents import benchmark_documents

    return benchmark_documents(
        config.data,
        config.out,
        models=config.models,
        mode=config.summary_mode,
        budget=config.summary_budget,
        split=config.split,
        limit=config.limit,
        max_new_tokens=config.max_new_tokens or 64,
        batch_size=config.batch_size,
        label=label,
    )


def run(
    data: str | Path,
    out: str | Path,
    options: PromptOptions | None = None,
    prompt: dict | None = None,
    label: str | None = None,
    trained: str | None = None,
    branch: dict | None = None,
    **settings,
) -> dict:
    """Run the stage; returns the metrics (also written to ``out/metrics.json``).

    `settings`: the other :class:`BenchmarkConfig` fields. ``options`` overrides every prompt
    setting, ``prompt`` the ones it names. ``label`` names the data in the report. ``trained``
    names the model (its series) this run is about: MLflow gets it as ``trained``, the other
    models as ``model/NAME``. ``branch`` (issue, algorithm) is recorded for the comparison of
    algorithms (:mod:`grail.benchmark.compare`)."""
    config = BenchmarkConfig(data=str(data), out=str(out), **settings)
    if config.task == "summarize":
        return summarize_run(config, label)
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
    truth = load_truth(data, config.truth)
    systems, skipped = reference_systems(rows, train, truth)
    logger.info("%s: %d %s rows; baselines and ceilings scored", data, len(rows), split)
    with tempfile.TemporaryDirectory(prefix="grail-benchmark-") as workdir:
        systems += model_systems(config.models, rows, overrides, config, Path(workdir))
    sides = slant_sides(rows, truth, load_slants(data, config.truth))
    choices = truth_choices(rows, truth)
    result = {
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
        "differences": differences(systems, rows, trained, config.bootstrap, choices),
        "opinion": opinion_table(systems, rows, train),
        "win_rates": win_rates(systems, rows, config.references),
        "skipped": skipped,
    }
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
        log_to_mlflow(result, out, trained)
    return result
