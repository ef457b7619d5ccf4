"""Compare the algorithms of one run per issue: did GRAIL simulate people better than GRPO?

Run: ``grail compare RESULTS [RESULTS ...] --out FOLDER`` with the benchmark outputs of each
branch (``metrics.json`` and ``predictions.parquet``, written by ``grail benchmark`` with the
branch's issue and algorithm). For each issue, each algorithm's final model (accuracy,
log-loss, position distance with their intervals, step 0 beside it) and, for every pair of
algorithms, the paired differences on the same validation rows (later minus earlier in
``ALGORITHM_ORDER``: GRPO and GRAIL minus behaviour cloning, GRAIL minus GRPO) with a
participant-bootstrap interval. Writes
``comparison.json`` and ``comparison.md``.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grail.core import bootstrap
from grail.core.errors import GrailError
from grail.core.markdown import section, table
from grail.core.outputs import read_benchmark
from grail.tasks.slate import metrics as m

ALGORITHM_ORDER = ("bc", "grpo", "grail")  # later minus earlier: what RL adds over cloning
SHOWN = ("accuracy", "log_loss", "expected_log_loss", "brier", "position_tv", "slant_tv")


@dataclass
class Branch:
    """One issue x algorithm's benchmark: its metrics and its final model's per-row answers."""

    issue: str
    algorithm: str
    result: dict
    final: dict  # the final model's entry in result["systems"]
    rows: list[dict]  # the final model's rows of predictions.parquet


def load_branch(folder: Path) -> Branch:
    """A benchmark output that names its branch and trained model."""
    import pyarrow.parquet as pq

    path = folder / "metrics.json"
    result = read_benchmark(folder)  # checked against its marker: an edited one is refused
    branch, trained = result.get("branch"), result.get("trained")
    if not branch or not trained:
        raise GrailError(f"{path}: names no branch (issue, algorithm) and trained model")
    series = {
        name: entry
        for name, entry in result["systems"].items()
        if (entry.get("series") or name) == trained and entry["kind"] == "model"
    }
    if not series:
        raise GrailError(f"{path}: the trained model {trained} was not benchmarked")
    name, final = max(series.items(), key=lambda item: item[1].get("step") or 0)
    table = pq.read_table(folder / "predictions.parquet").to_pylist()
    rows = sorted(
        (r for r in table if r["system"] == name), key=lambda r: (r["session_id"], r["step_index"])
    )
    return Branch(branch["issue"], branch["algorithm"], result, final | {"name": name}, rows)


def position_tv_difference(a: Branch, b: Branch, people: list[str], replicates: int) -> dict:
    """b's position distance minus a's, with a participant-bootstrap interval."""
    width = max(len(r["distribution"]) for r in a.rows)

    def padded(rows):
        return np.array(
            [r["distribution"] + [0.0] * (width - len(r["distribution"])) for r in rows]
        )

    gold = np.eye(width)[[r["gold_index"] - 1 for r in a.rows]]
    # columns: a's distributions, b's, the chosen positions, and 1 to count the rows
    per_row = np.column_stack([padded(a.rows), padded(b.rows), gold, np.ones(len(gold))])

    def tv(sums, start):  # a's (start 0) or b's (start width) distance from the chosen positions
        chosen = sums[:, 2 * width : 3 * width]
        return m.mean_distance(sums[:, start : start + width], chosen, sums[:, -1])

    statistic = bootstrap.SumStatistic(per_row, lambda sums: tv(sums, width) - tv(sums, 0))
    low, high = bootstrap.participant_bootstrap(statistic, people, replicates)
    every = np.arange(len(people))
    return {"difference": round(statistic(every), 4), "ci": [round(low, 4), round(high, 4)]}


def paired(a: Branch, b: Branch, replicates: int) -> dict:
    """b minus a on the same rows: accuracy, log-loss, position distance and (the study's
    choice model known) expected log-loss."""
    if [(r["session_id"], r["step_index"]) for r in a.rows] != [
        (r["session_id"], r["step_index"]) for r in b.rows
    ]:
        raise GrailError(
            f"{a.issue}: {a.algorithm} and {b.algorithm} were benchmarked on different rows"
        )
    people = [r["participant_id"] for r in a.rows]
    out = {
        "accuracy": bootstrap.paired_difference(
            [float(r["correct"]) for r in b.rows],
            [float(r["correct"]) for r in a.rows],
            people,
            replicates,
        )
    }
    if all(r["log_loss"] is not None for r in a.rows + b.rows):
        out["log_loss"] = bootstrap.paired_difference(
            [r["log_loss"] for r in b.rows], [r["log_loss"] for r in a.rows], people, replicates
        )
        out["position_tv"] = position_tv_difference(a, b, people, replicates)
    if all(r.get("expected_log_loss") is not None for r in a.rows + b.rows):
        out["expected_log_loss"] = bootstrap.paired_difference(
            [r["expected_log_loss"] for r in b.rows],
            [r["expected_log_loss"] for r in a.rows],
            people,
            replicates,
        )
    return out


def summary(branch: Branch) -> dict:
    """An algorithm's final model and its step 0, the fields the comparison shows."""
    final = branch.final
    start = next(
        (
            e
            for e in branch.result["systems"].values()
            if e.get("series") == final.get("series") and e.get("step") == 0
        ),
        None,
    )
    out = {"model": final["name"], "step": final.get("step")}
    for key in SHOWN:
        if final.get(key) is not None:
            ci = final.get(f"{key}_ci")
            if key == "accuracy" and "ci_low" in final:
                ci = [final["ci_low"], final["ci_high"]]
            out[key] = {"value": final[key], "ci": ci}
    if start is not None:
        out["start"] = {
            k: start[k] for k in ("accuracy", "log_loss", "expected_log_loss") if k in start
        }
    if final.get("collapsed"):
        out["collapsed"] = final["collapsed"]
    return out


def compare(folders: list[Path], replicates: int = 1000) -> dict:
    """Per issue: each algorithm's summary and the paired differences between algorithms."""
    by_issue: dict[str, dict[str, Branch]] = {}
    for folder in folders:
        branch = load_branch(Path(folder))
        if branch.algorithm in by_issue.setdefault(branch.issue, {}):
            raise GrailError(f"{folder}: a second {branch.algorithm} result for {branch.issue}")
        by_issue[branch.issue][branch.algorithm] = branch
    issues = {}
    for issue, found in sorted(by_issue.items()):
        order = sorted(found, key=lambda a: (ALGORITHM_ORDER + (a,)).index(a))
        issues[issue] = {
            "algorithms": {a: summary(found[a]) for a in order},
            "differences": {
                f"{b}_minus_{a}": paired(found[a], found[b], replicates)
                for a, b in itertools.combinations(order, 2)
            },
            "rows": len(found[order[0]].rows),
            "participants": len({r["participant_id"] for r in found[order[0]].rows}),
        }
    return {
        "issues": issues,
        "intervals": f"95% percentile bootstrap over participants ({replicates} replicates, "
        "seed 0), paired on the same rows",
    }


def _value(entry: dict | None) -> str:
    if not entry:
        return "–"
    ci = entry.get("ci")
    return f"{entry['value']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def markdown(comparison: dict) -> str:
    """``comparison.md``: per issue, the algorithms side by side and their differences."""
    lines = ["# Algorithms compared", "", f"Intervals: {comparison['intervals']}."]
    for issue, entry in comparison["issues"].items():
        rows = [
            [algorithm, s["model"]] + [_value(s.get(k)) for k in SHOWN] + [s.get("collapsed", "")]
            for algorithm, s in entry["algorithms"].items()
        ]
        for label, difference in entry["differences"].items():
            rows.append(
                [label.replace("_minus_", " − "), "difference"]
                + [
                    f"{d['difference']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]"
                    if (d := difference.get(k))
                    else "–"
                    for k in SHOWN
                ]
                + [""]
            )
        columns = ["algorithm", "model", *SHOWN, "collapse"]
        lines += section(
            f"{issue} ({entry['rows']} rows, {entry['participants']} participants)",
            *table(columns, rows),
        )
    lines += [
        "",
        "Lower is better for log_loss, brier and the distances; a difference whose interval "
        "excludes 0 is one the data supports.",
    ]
    return "\n".join(lines) + "\n"


def compare_headline(comparison: dict) -> dict[str, float]:
    """The differences as MLflow metrics: ``compare/ISSUE/B_minus_A/METRIC``."""
    return {
        f"compare/{issue}/{label}/{metric}": d["difference"]
        for issue, entry in comparison["issues"].items()
        for label, difference in entry["differences"].items()
        for metric, d in difference.items()
        if d.get("difference") is not None
    }


def run(results: list[str], out: str | Path, bootstrap: int = 1000) -> dict:
    """Compare and write ``comparison.json`` and ``comparison.md`` into `out`."""
    from grail.core.outputs import atomic_folder

    comparison = compare([Path(r) for r in results], bootstrap)
    with atomic_folder(Path(out), "compare") as staging:
        (staging / "comparison.json").write_text(json.dumps(comparison, indent=1) + "\n")
        (staging / "comparison.md").write_text(markdown(comparison))
    return comparison
