"""What the slate task's benchmark scores: its systems. The baselines and the study's own
choice model (the ceilings, when the data came from ``grail simulate``), and every model a spec
names, each asked the way it was trained, its answers mapped back to the displayed order."""

from __future__ import annotations

import csv
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from grail.core.errors import GrailError
from grail.inference.local import answer_local
from grail.inference.remote import answer_openai, dry_run
from grail.inference.specs import expand_specs, trained_prompt
from grail.tasks.slate.baselines import BASELINES, BLIND_CEILING, EXPECTED_CEILING, ORACLE, Skipped
from grail.tasks.slate.prompts import PromptOptions, shuffle_slate, to_example
from grail.tasks.slate.rewards import parse_answer, parse_opinion

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
    ablated: dict[str, list[list[float]]] | None = None  # distributions on swapped rows (reads)


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


READ_BY = ("ranker",)  # the baselines also asked the swapped rows (reads), for reference


def reference_systems(
    rows: list[dict], train: list[dict], truth, ablated: dict[str, list[dict]] | None = None
) -> tuple[list[System], dict]:
    """Expected random, what the truth file knows, and every baseline; skipped ones with
    reasons. The baselines of :data:`READ_BY` also answer `ablated`'s rows."""
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
        swapped = None
        if ablated and name in READ_BY:
            swapped = {k: baseline(train, r).distributions for k, r in ablated.items()}
        systems.append(
            System(
                name,
                "baseline",
                predictions=guesses.predictions,
                distributions=guesses.distributions,
                seconds=time.perf_counter() - started,
                ablated=swapped,
            )
        )
    return systems, skipped


PROMPT_DEFAULTS = asdict(PromptOptions()) | {"max_new_tokens": 128}


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
    specs: list[str],
    rows: list[dict],
    overrides: dict,
    config,
    workdir: Path,
    ablated: dict[str, list[dict]] | None = None,
) -> list[System]:
    """Evaluate every model the specs name, each asked the way it was trained unless
    `overrides` say otherwise; answers mapped back to the displayed order. `config`: the
    benchmark stage's settings (its ``BenchmarkConfig``). `ablated`: rows asked again of each
    local model, in the same pass (:mod:`grail.tasks.slate.benchmark.reads`); their choice
    distributions go to the system's ``ablated``."""
    systems = []
    ablated = ablated or {}
    expanded = expand_specs(specs, workdir, config.start_model)  # the first: the trained model
    # One local model asked one way is answered once, under every name it has (the start of
    # two runs, or a run's last checkpoint beside its final folder): greedy answers are the same.
    answered: dict[tuple, object] = {}
    for spec in expanded:
        prompt = prompt_for(spec, overrides)
        extra = [] if spec.kind == "openai" else [r for name in ablated for r in ablated[name]]
        presented, conversations = ask(rows + extra, prompt)
        started = time.perf_counter()
        logger.info(
            "%s: asking %d questions (%d rows%s)",
            spec.name,
            len(conversations),
            len(rows),
            f", {len(extra)} with a part swapped: does it read?" if extra else "",
        )
        if spec.kind == "openai" and config.dry_run:
            print(dry_run(spec, conversations, prompt["max_new_tokens"]))
            continue
        key = (spec.path and str(Path(spec.path).resolve()), json.dumps(prompt, sort_keys=True))
        if spec.kind == "openai" or key not in answered:
            answered[key] = answer(spec, conversations, rows + extra, prompt, config)
        else:
            logger.info("%s: the same model asked the same way as before", spec.name)
        answers = answered[key]
        predictions, distributions = displayed(rows + extra, presented, answers)
        completions = answers.completions[: len(rows)]
        opinions = [parse_opinion(t or "") for t in completions] if prompt["opinion"] else None
        cuts = np.cumsum([len(rows)] + [len(r) for r in ablated.values()]) if extra else []
        systems.append(
            System(
                spec.name,
                "model",
                predictions=predictions[: len(rows)],
                distributions=distributions[: len(rows)],
                method=answers.method,
                completions=completions,
                opinions=opinions,
                step=spec.step,
                series=spec.series,
                seconds=time.perf_counter() - started,
                prompt=prompt,
                ablated={
                    name: distributions[cuts[k] : cuts[k + 1]] for k, name in enumerate(ablated)
                }
                if extra
                else None,
            )
        )
        logger.info("%s: answered in %.0f s", spec.name, systems[-1].seconds)
    return systems


def answer(spec, conversations: list[list[dict]], rows: list[dict], prompt: dict, config):
    """A model's answers to `conversations` (an API model's or a local one's)."""
    options = [r["n_options"] for r in rows]
    tokens = prompt["max_new_tokens"]
    if spec.kind == "openai":
        return answer_openai(
            spec, conversations, options, parse_answer, tokens, config.concurrency, config.samples
        )
    return answer_local(
        spec.path,
        conversations,
        options,
        tokens,
        config.batch_size,
        config.backend,
        config.thought_samples,
    )


def displayed(rows: list[dict], presented: list[dict], answers) -> tuple[list, list]:
    """Each row's pick and choice distribution in its displayed order (the model was asked
    `presented`: the options shuffled when its prompt shuffles them)."""
    predictions, distributions = [], []
    for row, shown, text, shares in zip(
        rows, presented, answers.completions, answers.distributions, strict=True
    ):
        pick = parse_answer(text or "", row["n_options"])
        chosen = shown["slate"][pick - 1]["id"] if pick else None
        predictions.append(
            next((j + 1 for j, item in enumerate(row["slate"]) if item["id"] == chosen), None)
        )
        by_id = {item["id"]: p for item, p in zip(shown["slate"], shares, strict=True)}
        distributions.append([by_id[item["id"]] for item in row["slate"]])
    return predictions, distributions
