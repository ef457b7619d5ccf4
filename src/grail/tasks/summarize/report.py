"""The summarize task's report (``report.md`` of ``grail benchmark --task summarize``) and its
two charts: questions answered by training step (``answered_vs_step.svg``, the baselines,
ceilings and API models as lines) and every system side by side (``answered_by_model.svg``);
and what ``grail run --local`` prints of its branches (:func:`document_table`)."""

from __future__ import annotations

from pathlib import Path

from grail.core.charts import pyplot, save_svg
from grail.core.markdown import table as markdown_table
from grail.tasks.headline import change, exported_line, number

INTERVAL = "95% document-bootstrap interval"


def cell(entry: dict | None) -> str:
    if not entry:
        return "–"
    low, high = entry["ci"]
    return f"{entry['mean']:.3f} [{low:.3f}, {high:.3f}]"


def reading(result: dict) -> str:
    """Who read the summaries, and what reading could not tell."""
    reader = result.get("reader") or {}
    if not reader.get("reader"):
        return "Questions answered by the deterministic reader from the summary alone"
    judge = (
        f"the judge `{reader['judge']}` for the rest"
        if reader.get("judge")
        else "no judge (answers that do not match count as wrong)"
    )
    counts = reader.get("counts") or {}
    missing = counts.get("reader_failed", 0) + counts.get("judge_failed", 0)
    return (
        f"Questions answered by the reader `{reader['reader']}` from the summary alone, matched "
        f"against the gold answer (exact or token F1 >= {reader['f1_match']}), {judge}; "
        f"{counts.get('questions', 0)} questions read, {counts.get('judged', 0)} judged, "
        f"{missing} verdicts missing (failed requests or unclear verdicts: left out, not 0)"
    )


def report_markdown(result: dict) -> str:
    """The report: one table of systems, each trained series' change from step 0, win rates."""
    rows = [
        [
            name,
            entry["kind"],
            cell(entry["answered"]),
            cell(entry["answerable_answered"]),
            f"{entry['parse_rate']:.2f}",
            f"{entry['words']:.0f}",
            f"{entry['compression']:.2f}",
            f"{entry['unsupported_per_summary']:.2f}",
            str(entry.get("missing_verdicts", 0) + entry.get("failed_requests", 0)),
        ]
        for name, entry in result["systems"].items()
    ]
    lines = [
        f"# Summaries: {result['data']} ({result['split']}, {result['documents']} documents)",
        "",
        f"Mode {result['mode']}, budget {result['budget']} "
        f"{'sentences' if result['mode'] == 'extractive' else 'characters'} (stated in the "
        f"prompt). {reading(result)}; {result['intervals']}.",
        "",
        *markdown_table(
            [
                "system",
                "kind",
                "answered",
                "answerable answered",
                "parse rate",
                "words",
                "compression",
                "unsupported / summary",
                "missing",
            ],
            rows,
            right=5,
        ),  # fmt: skip
    ]
    if result.get("position_only"):
        lines += [
            "",
            f"Position-only ceiling: {cell(result['position_only'])} of the questions answered "
            "in expectation by sentence 1 and random others, the best a summarizer that sees "
            "positions but not words can do on this study; a model at or below it has "
            "learned no more than positions.",
        ]
    lines += exported_lines(result.get("chosen"))
    for label, diff in result["differences"].items():
        low, high = diff["ci"]
        verdict = (
            "beats its step 0 (the interval excludes zero)"
            if low > 0
            else "is worse than its step 0 (the interval excludes zero)"
            if high < 0
            else "does not beat its step 0 (the interval includes zero)"
        )
        lines += [
            "",
            f"**{label}** {verdict}: {diff['final']} minus {diff['start']}, "
            f"{diff['difference']:+.3f} [{low:+.3f}, {high:+.3f}] of the questions answered, "
            "paired by document.",
        ]
    if result.get("win_rates"):
        against = sorted({b for rates in result["win_rates"].values() for b in rates})
        lines += [
            "",
            "Win rates (1 a document where the model's summary answers more questions, 0.5 a "
            f"tie, 0 fewer; {INTERVAL}):",
            "",
            *markdown_table(
                ["model", *against],
                [
                    [model, *(cell(rates.get(b)) for b in against)]
                    for model, rates in result["win_rates"].items()
                ],
            ),
        ]
    return "\n".join(lines) + "\n"


def _subject(result: dict) -> str:
    branch = result.get("branch")
    where = f"{branch['algorithm']}, " if branch else ""
    return f"{where}{result['split']}, {result['documents']} documents"


# Reference lines: each in its own style, so they read apart in grey print too.
REFERENCE_STYLES = {
    "random_k": {"linestyle": ":", "color": "#999999"},
    "lead_k": {"linestyle": "-.", "color": "#555555"},
    "tfidf_centrality": {"linestyle": "--", "color": "#8172b2"},
    "oracle": {"linestyle": (0, (6, 2, 1, 2, 1, 2)), "color": "#c44e52", "linewidth": 1.5},
    "full_document": {"linestyle": (0, (1, 1)), "color": "#c44e52"},
}
MODEL_STYLES = [{"linestyle": (0, (4, 1)), "color": c} for c in ("#dd8452", "#55a868", "#937860")]


def chart_by_step(result: dict, path: Path) -> bool:
    """Questions answered against training step per trained series, from step 0, with the
    baselines, ceilings and the other models (API models) as lines; False without a series."""
    series: dict[str, list] = {}
    for s in result["systems"].values():
        if s.get("series") and s.get("step") is not None and s.get("answered"):
            series.setdefault(s["series"], []).append(s)
    if not series:
        return False
    fig, ax = pyplot().subplots(figsize=(8, 5))
    for label, points in series.items():
        points.sort(key=lambda s: s["step"])
        x = [p["step"] for p in points]
        y = [p["answered"]["mean"] for p in points]
        errors = [
            [v - p["answered"]["ci"][0] for v, p in zip(y, points, strict=True)],
            [p["answered"]["ci"][1] - v for v, p in zip(y, points, strict=True)],
        ]
        line = ax.errorbar(x, y, yerr=errors, marker="o", capsize=3, label=label, linewidth=2)
        line[0].set_gid(f"series-{label}")
    others = [
        (name, s)
        for name, s in result["systems"].items()
        if s["kind"] == "model" and not s.get("series") and s.get("answered")
    ]
    for (name, s), style in zip(others, MODEL_STYLES * len(others), strict=False):
        ax.axhline(s["answered"]["mean"], label=name, linewidth=1, **style).set_gid(
            f"reference-{name}"
        )
    for name, style in REFERENCE_STYLES.items():
        entry = result["systems"].get(name)
        if entry and entry.get("answered"):
            ax.axhline(entry["answered"]["mean"], label=name, **({"linewidth": 1} | style)).set_gid(
                f"reference-{name}"
            )
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("training step (0: the starting model)")
    ax.set_ylabel(f"share of hidden questions answered\n({INTERVAL})")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Questions answered vs training step: {_subject(result)}")
    ax.legend(loc="best", fontsize=8)
    save_svg(fig, path)
    return True


def chart_by_model(result: dict, path: Path) -> None:
    """Every system side by side: the share answered with its interval (a series' final
    model; its step 0 too)."""
    final: dict[str, tuple[str, dict]] = {}
    for name, s in result["systems"].items():
        if not s.get("answered"):
            continue
        key = s.get("series") or name
        if s.get("step") == 0:
            key = name  # the starting model keeps a bar of its own
        if key not in final or (s.get("step") or 0) >= (final[key][1].get("step") or 0):
            final[key] = (name, s)
    items = sorted(final.values(), key=lambda item: item[1]["answered"]["mean"])
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(items) + 1.5))
    colors = {"model": "#4c72b0", "ceiling": "#c44e52"}
    for y, (name, s) in enumerate(items):
        mean, (low, high) = s["answered"]["mean"], s["answered"]["ci"]
        bar = ax.barh(
            y,
            mean,
            color=colors.get(s["kind"], "#999999"),
            xerr=[[mean - low], [high - mean]],
            capsize=3,
        )
        bar.patches[0].set_gid(f"series-{name}")
    ax.set_yticks(range(len(items)), [name for name, _ in items])
    ax.set_xlabel(f"share of hidden questions answered ({INTERVAL})")
    ax.set_xlim(0, 1.05)
    ax.set_title(f"Questions answered by system: {_subject(result)}")
    save_svg(fig, path)


def audit_markdown(audit: dict) -> str:
    """What the clean stage read and kept (``audit.json``), as the audit artifact shows it."""
    return (
        "\n".join(
            [
                f"# Documents: {audit['source']}",
                "",
                *markdown_table(["field", "value"], [[k, str(v)] for k, v in audit.items()]),
            ]
        )
        + "\n"
    )


def exported_lines(chosen: dict | None) -> list[str]:
    """Which checkpoint the pipeline's export takes, and why (:mod:`grail.core.selection`)."""
    if not chosen:
        return []
    return [
        "",
        f"Exported: step {chosen['step']} of {chosen['last_step']}, {chosen['reason']} (the "
        f"rule: {chosen['rule']}).",
    ]


def document_table(rows: list[dict], comparison: dict | None = None) -> str:
    """The summarize task's closing table (its ``closing_table`` part; it compares no
    algorithms, so `comparison` is None): per algorithm, the share of hidden questions
    answered by the final model (document-bootstrap interval), by step 0, the paired change,
    the best baseline and the ceilings (oracle / full document); then whether training helped.

    >>> print(document_table([{"issue": "summarize", "algorithm": "grpo", "answered": 0.5,
    ...     "answered_ci_low": 0.45, "answered_ci_high": 0.55, "start_answered": 0.4,
    ...     "final_minus_start/answered_difference": 0.1,
    ...     "final_minus_start/answered_ci_low": 0.05,
    ...     "final_minus_start/answered_ci_high": 0.15, "best_baseline": "tfidf_centrality",
    ...     "best_baseline_answered": 0.71, "oracle_answered": 1.0,
    ...     "full_document_answered": 1.0}]))
    task       algorithm  answered [95% CI]   step 0  change [95% CI]          best baseline           ceiling
    summarize  grpo       0.500 [0.45, 0.55]  0.400   +0.100 [+0.050, +0.150]  tfidf_centrality 0.710  1.000/1.000
    grpo: beats its step 0 (the interval excludes zero)
    """  # noqa: E501 (the table as printed)
    lines = [
        f"{'task':<10} {'algorithm':<10} {'answered [95% CI]':<19} {'step 0':<7} "
        f"{'change [95% CI]':<24} {'best baseline':<23} ceiling"
    ]
    verdicts = []
    for r in rows:
        ci = (
            f" [{r['answered_ci_low']:.2f}, {r['answered_ci_high']:.2f}]"
            if "answered_ci_low" in r
            else ""
        )
        base = (
            f"{r['best_baseline']} {r['best_baseline_answered']:.3f}"
            if "best_baseline" in r
            else "-"
        )
        ceiling = f"{number(r, 'oracle_answered')}/{number(r, 'full_document_answered')}"
        lines.append(
            f"{'summarize':<10} {r.get('algorithm', ''):<10} {number(r, 'answered') + ci:<19} "
            f"{number(r, 'start_answered'):<7} {change(r, 'answered'):<24} {base:<23} {ceiling}"
        )
        low = r.get("final_minus_start/answered_ci_low")
        high = r.get("final_minus_start/answered_ci_high")
        if low is None:
            verdict = "no step 0 to compare with"
        elif low > 0:
            verdict = "beats its step 0 (the interval excludes zero)"
        elif high < 0:
            verdict = "is worse than its step 0 (the interval excludes zero)"
        else:
            verdict = "does not beat its step 0 (the interval includes zero)"
        verdicts.append(f"{r.get('algorithm', '')}: {verdict}")
        if r.get("exported_step") is not None:
            verdicts.append(f"{r.get('algorithm', '')}: {exported_line(r)}")
        if r.get("promotion"):
            verdicts.append(f"{r.get('algorithm', '')}: {r['promotion']}")
    return "\n".join(lines + verdicts)
