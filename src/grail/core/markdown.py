"""Markdown for what a person reads: aligned tables, sections, intervals and counts (the audit
and the benchmark reports both write theirs with these)."""

from __future__ import annotations


def table(columns: list[str], rows: list[list], right: int = 0) -> list[str]:
    """A Markdown table; the last `right` columns are right-aligned (numbers).

    >>> print("\\n".join(table(["system", "n"], [["ranker", 3]], right=1)))
    | system | n |
    |---|---:|
    | ranker | 3 |
    """
    rule = "|" + "---|" * (len(columns) - right) + "---:|" * right
    return [
        "| " + " | ".join(columns) + " |",
        rule,
        *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows),
    ]


def section(title: str, *body: str) -> list[str]:
    """A ``##`` heading and its lines, with the blank lines around it."""
    return ["", f"## {title}", "", *body]


def ci(entry: dict) -> str:
    return f"{entry['accuracy']:.3f} [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}]"


def histogram(counts: dict) -> str:
    return " ".join(f"{k}:{v}" for k, v in counts.items())


def counts_text(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"
