"""What the slate task says in MLflow (:mod:`grail.core.run_notes`): the headline columns of
the runs table, the parent run's table (accuracy, log-loss against step 0, best baseline,
ceiling), and a registered model version's description and tags."""

from __future__ import annotations

from grail.core.run_notes import (
    Notes,
    _interval,
    _number,
    best_baseline_text,
    change,
    report_link,
    version_tags,
    version_text,
)
from grail.core.selection import finite

HEADLINE_FIELDS = (
    "accuracy",
    "log_loss",
    "final_minus_start/log_loss_difference",
    "best_baseline_accuracy",
)
SLATE_TABLE = (
    "| issue | algorithm | accuracy [95% CI] | log-loss | step 0 | change [95% CI] "
    "| best baseline | ceiling acc/log-loss | benchmark |",
    "|---|---|---|---|---|---|---|---|---|",
)


def row(values: dict, issue: str, algorithm: str, experiment_id: str, bench: str | None) -> str:
    """One branch's row of the parent run's table."""
    v = values
    best_text, link = best_baseline_text(v, "accuracy"), report_link(experiment_id, bench)
    flag = " **collapsed**" if v.get("collapsed") else ""
    return (
        f"| {issue} | {algorithm}{flag} | {_number(v.get('accuracy'))}"
        f"{_interval(v.get('ci_low'), v.get('ci_high'))} | {_number(v.get('log_loss'))} "
        f"| {_number(v.get('start_log_loss'))} | {change(v, 'log_loss')} | {best_text} | "
        f"{_number(v.get('ceiling_accuracy'))}/{_number(v.get('ceiling_log_loss'))} "
        f"| {link} |"
    )


NOTES = Notes(
    fields=HEADLINE_FIELDS,
    table=SLATE_TABLE,
    row=row,
    intervals="Intervals: 95% percentile bootstrap over participants. Comparison with "
    "intervals: this run's artifacts, compare/comparison.md.",
)


def version_story(
    summary: dict,
    issue: str,
    algorithm: str,
    run: str,
    fingerprint: str | None,
    sources: dict[str, str],
) -> tuple[str, dict[str, str]]:
    """A model version's description and tags from its benchmark's headline (`summary`, as
    :func:`grail.tasks.slate.benchmark.records.benchmark_headline` gives it); `sources`:
    ``train_run``, ``benchmark_run``, ``benchmark_report`` (where the report is),
    ``export_location`` (the exported model).

    >>> text, tags = version_story({"accuracy": 0.4, "ci_low": 0.3, "ci_high": 0.5,
    ...     "log_loss": 1.32, "start_log_loss": 1.348, "best_baseline": "ranker",
    ...     "best_baseline_accuracy": 0.56}, "gun_control", "grail", "r1", "f00d", {})
    >>> text.splitlines()[0]
    'GRAIL on gun_control, pipeline run r1.'
    >>> tags["accuracy"], tags["accuracy_ci"], tags["best_baseline"], tags["data_fingerprint"]
    ('0.400', '[0.300, 0.500]', 'ranker 0.560', 'f00d')
    """
    accuracy = _number(summary.get("accuracy")) + _interval(
        summary.get("ci_low"), summary.get("ci_high")
    )
    best_text = best_baseline_text(summary, "accuracy")
    head = (
        f"{algorithm.upper()} on {issue}, pipeline run {run}.\n"
        f"Validation accuracy {accuracy} (best baseline {best_text}); log-loss "
        f"{_number(summary.get('log_loss'))}, step 0 {_number(summary.get('start_log_loss'))}, "
        f"change {change(summary, 'log_loss')} (95% participant-bootstrap intervals)."
    )
    collapsed = [f"Collapsed: {summary['collapsed']}."] if summary.get("collapsed") else []
    figures = {
        "accuracy": _number(summary.get("accuracy")),
        "accuracy_ci": _interval(summary.get("ci_low"), summary.get("ci_high")).strip(),
        "log_loss": _number(summary.get("log_loss")),
        "log_loss_change": change(summary, "log_loss"),
        "best_baseline": best_text,
    }
    return (
        version_text(head, sources, *collapsed),
        version_tags(issue, algorithm, run, figures, fingerprint, sources),
    )


def promotion(summary: dict) -> tuple[bool, str]:
    """Whether a benchmarked simulator may be promoted (``promote_if: beats_prior``), with the
    reason in words: the held-out log-loss of the checkpoint exported (the final model, or the
    earlier one :mod:`grail.core.selection` chose) minus always-first's (the position
    prior), paired over the same rows, has a participant-bootstrap interval wholly below 0,
    and it did not collapse. `summary`: the benchmark's headline
    (:func:`grail.tasks.slate.benchmark.records.benchmark_headline`).

    >>> key = "final_minus_always_first/log_loss"
    >>> promotion({f"{key}_difference": -0.02, f"{key}_ci_low": -0.04, f"{key}_ci_high": -0.01})
    (True, 'beats always-first: log-loss -0.020 [-0.040, -0.010]')
    >>> promotion({f"{key}_difference": 0.0, f"{key}_ci_low": -0.007, f"{key}_ci_high": 0.008})
    (False, 'no better than always-first: log-loss +0.000 [-0.007, +0.008]')
    >>> promotion({f"{key}_difference": -0.02, f"{key}_ci_low": -0.04, f"{key}_ci_high": -0.01,
    ...     "collapsed": "one answer"})
    (False, 'collapsed: one answer')
    >>> promotion({})
    (False, 'no paired log-loss against always-first in the benchmark')
    """
    key = "final_minus_always_first/log_loss"
    if summary.get("chosen_minus_always_first/log_loss_difference") is not None:
        key = "chosen_minus_always_first/log_loss"  # an earlier checkpoint is exported
    if summary.get("collapsed"):
        return False, f"collapsed: {summary['collapsed']}"
    difference, low, high = (summary.get(f"{key}_{k}") for k in ("difference", "ci_low", "ci_high"))
    if not finite(difference, low, high):  # absent, or NaN: no evidence either way
        return False, "no paired log-loss against always-first in the benchmark"
    figures = f"log-loss {difference:+.3f} [{low:+.3f}, {high:+.3f}]"
    if high < 0:
        return True, f"beats always-first: {figures}"
    return False, f"no better than always-first: {figures}"
