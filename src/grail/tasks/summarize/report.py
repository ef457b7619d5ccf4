"""The summarize task's report (``report.md`` of ``grail benchmark --task summarize``): one
table of systems, then each trained series' change from its step 0."""

from __future__ import annotations

from grail.core.markdown import table as markdown_table


def cell(entry: dict | None) -> str:
    if not entry:
        return "–"
    low, high = entry["ci"]
    return f"{entry['mean']:.3f} [{low:.3f}, {high:.3f}]"


def report_markdown(result: dict) -> str:
    """The report: one table of systems, then each trained series' change from step 0."""
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
        ]
        for name, entry in result["systems"].items()
    ]
    lines = [
        f"# Summaries: {result['data']} ({result['split']}, {result['documents']} documents)",
        "",
        f"Mode {result['mode']}, budget {result['budget']} "
        f"{'sentences' if result['mode'] == 'extractive' else 'characters'} (stated in the "
        "prompt). Questions answered by the deterministic reader from the summary alone; "
        f"{result['intervals']}.",
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
            ],
            rows,
            right=4,
        ),  # fmt: skip
    ]
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
    return "\n".join(lines) + "\n"
