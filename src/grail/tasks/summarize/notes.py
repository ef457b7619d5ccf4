"""What the summarize task says in MLflow (:mod:`grail.core.run_notes`): questions answered
instead of choices, in the runs table's columns, the parent run's table and a registered model
version's description and tags."""

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

DOCUMENT_HEADLINE_FIELDS = (
    "answered",
    "start_answered",
    "final_minus_start/answered_difference",
    "best_baseline_answered",
)
DOCUMENT_TABLE = (
    "| task | algorithm | answered [95% CI] | step 0 | change [95% CI] | best baseline "
    "| oracle / full document | benchmark |",
    "|---|---|---|---|---|---|---|---|",
)


def row(values: dict, issue: str, algorithm: str, experiment_id: str, bench: str | None) -> str:
    """One branch's row of the parent run's table."""
    v = values
    best_text, link = best_baseline_text(v, "answered"), report_link(experiment_id, bench)
    return (
        f"| {issue} | {algorithm} | {_number(v.get('answered'))}"
        f"{_interval(v.get('answered_ci_low'), v.get('answered_ci_high'))} "
        f"| {_number(v.get('start_answered'))} | {change(v, 'answered')} | {best_text} "
        f"| {_number(v.get('oracle_answered'))} / {_number(v.get('full_document_answered'))} "
        f"| {link} |"
    )


NOTES = Notes(
    fields=DOCUMENT_HEADLINE_FIELDS,
    table=DOCUMENT_TABLE,
    row=row,
    intervals="Intervals: 95% percentile bootstrap over documents.",
)


def version_story(
    summary: dict,
    issue: str,
    algorithm: str,
    run: str,
    fingerprint: str | None,
    sources: dict[str, str],
) -> tuple[str, dict[str, str]]:
    """A summarizer's model version: its description and tags from its benchmark's
    headline (`summary`); `sources` as the slate task's
    (:func:`grail.tasks.slate.notes.version_story`).

    >>> text, tags = version_story({"answered": 0.5, "answered_ci_low": 0.4,
    ...     "answered_ci_high": 0.6, "start_answered": 0.39, "best_baseline": "lead_k",
    ...     "best_baseline_answered": 0.65}, "summarize", "grpo", "r1", None, {})
    >>> line = text.splitlines()[1]
    >>> "answered on the validation documents 0.500 [0.400, 0.600]" in line, "step 0 0.390" in line
    (True, True)
    """
    answered = _number(summary.get("answered")) + _interval(
        summary.get("answered_ci_low"), summary.get("answered_ci_high")
    )
    best_text = best_baseline_text(summary, "answered")
    head = (
        f"{algorithm.upper()} on {issue}, pipeline run {run}.\n"
        f"Questions answered on the validation documents {answered} (best baseline "
        f"{best_text}); step 0 {_number(summary.get('start_answered'))}, change "
        f"{change(summary, 'answered')} (95% document-bootstrap intervals)."
    )
    figures = {
        "answered": _number(summary.get("answered")),
        "answered_ci": _interval(
            summary.get("answered_ci_low"), summary.get("answered_ci_high")
        ).strip(),
        "answered_change": change(summary, "answered"),
        "best_baseline": best_text,
    }
    return (
        version_text(head, sources),
        version_tags(issue, algorithm, run, figures, fingerprint, sources),
    )


def promotion(summary: dict) -> tuple[bool, str]:
    """Whether a benchmarked summarizer may be promoted (``promote_if: beats_prior``), with the
    reason in words: the lower bound of its share answered (the document-bootstrap interval)
    is above the best baseline's share. `summary`: the benchmark's headline
    (:func:`grail.tasks.summarize.benchmark.documents_headline`).

    >>> best = {"best_baseline": "lead_k", "best_baseline_answered": 0.6}
    >>> promotion({"answered": 0.7, "answered_ci_low": 0.65, "answered_ci_high": 0.75} | best)
    (True, 'beats lead_k (0.600): answered 0.700 [0.650, 0.750]')
    >>> promotion({"answered": 0.62, "answered_ci_low": 0.55, "answered_ci_high": 0.69} | best)
    (False, 'no better than lead_k (0.600): answered 0.620 [0.550, 0.690]')
    >>> promotion({"answered": 0.62, "answered_ci_low": 0.55, "answered_ci_high": 0.69})
    (False, 'no baseline in the benchmark to beat')
    """
    answered, low, high = (summary.get(k) for k in ("answered", "answered_ci_low",
                                                     "answered_ci_high"))  # fmt: skip
    best, baseline = summary.get("best_baseline"), summary.get("best_baseline_answered")
    if not finite(answered, low, high):  # absent, or NaN: no evidence either way
        return False, "no share answered with an interval in the benchmark"
    if best is None or not finite(baseline):
        return False, "no baseline in the benchmark to beat"
    figures = f"answered {answered:.3f} [{low:.3f}, {high:.3f}]"
    if low > baseline:
        return True, f"beats {best} ({baseline:.3f}): {figures}"
    return False, f"no better than {best} ({baseline:.3f}): {figures}"
