"""How the benchmark scores each system on the rows: accuracy, the simulator scores, slants,
collapse, opinions, win rates, and the paired differences that say whether training helped;
every interval a bootstrap over participants."""

from __future__ import annotations

import logging
from collections import Counter

from grail.core import bootstrap
from grail.core.errors import GrailError
from grail.tasks.slate import metrics as m
from grail.tasks.slate.baselines import ORACLE
from grail.tasks.slate.benchmark.reads import reads
from grail.tasks.slate.benchmark.systems import System, group_key

logger = logging.getLogger(__name__)


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
        **read_scores(system, rows, replicates),
    }


def read_scores(system: System, rows: list[dict], replicates: int) -> dict:
    """Whether the system reads (:mod:`grail.tasks.slate.benchmark.reads`): for each swap it
    answered (the first ``reads_NAME_rows`` rows), ``reads_NAME``, log-loss swapped minus as
    shown, and its participant-bootstrap interval (``reads_NAME_ci_low``, ``_ci_high``)."""
    out = {}
    for name, swapped in (system.ablated or {}).items():
        got = reads(system.distributions[: len(swapped)], swapped, rows[: len(swapped)], replicates)
        low, high = got["ci"] or (None, None)
        out |= {
            f"reads_{name}": got["difference"],
            f"reads_{name}_ci_low": low,
            f"reads_{name}_ci_high": high,
            f"reads_{name}_rows": got["n"],
        }
    return out


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


def chosen_checkpoint(
    systems: list[System], rows: list[dict], trained: str | None, replicates: int
) -> dict | None:
    """The checkpoint of the trained series the pipeline exports
    (:func:`grail.core.selection.choose_checkpoint`): the lowest held-out log-loss among
    the run's checkpoints (step 0 left out), where it beats the last by more than its paired
    participant-bootstrap interval; None without a trained series scored by log-loss."""
    from grail.core.selection import choose_checkpoint

    series = {
        s.step or 0: s
        for s in systems
        if s.kind == "model" and (s.series or s.name) == trained and s.distributions is not None
    }
    steps = {step: per_row(s, rows)["log_loss"] for step, s in series.items() if step > 0}
    if not steps:
        return None
    people = [r["participant_id"] for r in rows]
    chosen = choose_checkpoint(
        {step: sum(losses) / len(losses) for step, losses in steps.items()},
        lambda a, b: bootstrap.paired_difference(steps[a], steps[b], people, replicates),
        lower_is_better=True,
        metric="log-loss",
    )
    return chosen | {"system": series[chosen["step"]].name}


def differences(
    systems: list[System],
    rows: list[dict],
    trained: str | None,
    replicates: int,
    choices: list[list[float]] | None = None,
    chosen: str | None = None,
) -> dict:
    """Paired differences with participant-bootstrap intervals: the trained model's final step
    minus always-first, the position prior (``final_minus_always_first``: the first question a
    simulator of people must answer), minus its step 0 (``final_minus_start``), and minus the
    best baseline by log-loss (``final_minus_best_baseline``, named in ``best_baseline``); the
    checkpoint chosen for export (`chosen`, a system's name: :func:`chosen_checkpoint`) minus
    always-first (``chosen_minus_always_first``) where it is not the final one."""
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
    prior = next((s for s in baselines if s.name == "always_first"), None)
    picked = next((s for s in series if s.name == chosen and s is not final), None)
    for label, mine, other in (
        ("final_minus_always_first", final, prior),
        ("final_minus_start", final, start),
        ("final_minus_best_baseline", final, best),
        ("chosen_minus_always_first", picked, prior),
    ):
        if mine is None or other is None or other is mine:
            continue
        own = ours if mine is final else per_row(mine, rows, choices)
        theirs = per_row(other, rows, choices)
        out[label] = {
            metric: bootstrap.paired_difference(own[metric], theirs[metric], people, replicates)
            | {"against": other.name}
            for metric in own
            if metric in theirs
        }
    return out


PRIOR, UNIFORM = "always_first", "random (expected)"  # the references a score is normalised by


def normalised_scores(systems: dict[str, dict]) -> None:
    """Each scored system's share of the gap a reference leaves to the ceiling, in percent, as
    SimBench normalises (100 x (1 - distance / the reference's distance)): ``score_vs_prior``
    from always-first (the position prior) and ``score_vs_uniform`` from uniform, the distance
    being the expected log-loss minus the study's choice model's (its exact ceiling; the
    observed log-loss when a system has no expected one). 100 is the ceiling, 0 the reference,
    below 0 worse than it. Only where the study's choice model is known (synthetic studies).

    >>> systems = {"bayes_optimal (expected)": {"expected_log_loss": 1.0},
    ...            "always_first": {"expected_log_loss": 1.2},
    ...            "random (expected)": {"expected_log_loss": 1.4},
    ...            "model": {"expected_log_loss": 1.15}}
    >>> normalised_scores(systems)
    >>> systems["model"]["score_vs_prior"], systems["model"]["score_vs_uniform"]
    (25.0, 62.5)
    """
    from grail.tasks.slate.baselines import EXPECTED_CEILING

    def loss(entry: dict) -> float | None:
        return entry.get("expected_log_loss", entry.get("log_loss"))

    ceiling = loss(systems.get(EXPECTED_CEILING, {}))
    if ceiling is None:
        return
    for reference, key in ((PRIOR, "score_vs_prior"), (UNIFORM, "score_vs_uniform")):
        gap = (loss(systems.get(reference, {})) or ceiling) - ceiling
        if gap <= 0:
            continue
        for entry in systems.values():
            if loss(entry) is not None:
                entry[key] = round(100 * (1 - (loss(entry) - ceiling) / gap), 1)
