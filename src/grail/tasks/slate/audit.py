"""Data audit: slate sizes, gold positions, position baselines, and two leakage detectors.

Run: ``grail audit data/ [--json audit.json]`` (a cleaned folder or one parquet file in the
contract); ``grail clean`` runs it too. Reported per issue and study, and for all rows.

Detectors (each reports ``severity`` none / warning / high and the evidence):

- **position leakage** — the gold sits at one fixed position far beyond chance. Over slates of 3 or
  more options (per slate size with >= 30 rows, and over all of them for "first" and "last"), the
  largest share of rows whose gold is at one position: ``warning`` at >= 0.65, ``high`` at >= 0.80.
  Upstream's appended-gold slates put the gold last in ~95% of rows. A human first-slot preference
  (about 45% on slates of 4 in the minimum-wage studies) stays below the threshold: it is reported
  as ``position_preference`` but is not leakage.
- **metadata leakage** — the gold option's missing-field pattern (which of title, channel,
  duration, views, likes, comments are null) differs from every other option's in a large share of
  rows. Compared with a decoy (the option after the gold, cyclically) measured the same way, so
  that ordinary random missingness cancels out: ``excess = gold share - decoy share``;
  ``warning`` at >= 0.10, ``high`` at >= 0.25.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa

from grail.core.markdown import counts_text, histogram, section, table
from grail.tasks.slate.contract import read_dataset

MIN_ROWS = 30
POSITION_THRESHOLDS = {"high": 0.80, "warning": 0.65}
METADATA_THRESHOLDS = {"high": 0.25, "warning": 0.10}
METADATA_FIELDS = ("title", "channel", "duration_seconds", "views", "likes", "comments")


def _severity(value: float, thresholds: dict[str, float]) -> str:
    return next((name for name, limit in thresholds.items() if value >= limit), "none")


def position_baselines(gold: list[int], n_options: list[int]) -> dict:
    """Accuracy of always-first, always-last, most-frequent position, and expected random.

    >>> b = position_baselines([1, 1, 2, 3], [3, 3, 3, 3])
    >>> b["always_first"], b["always_last"], b["most_frequent_position"], b["expected_random"]
    (0.5, 0.25, {'position': 1, 'accuracy': 0.5}, 0.3333)
    """
    rows = len(gold)
    counts = Counter(gold)
    position, hits = max(sorted(counts.items()), key=lambda item: item[1])
    return {
        "always_first": round(counts[1] / rows, 4),
        "always_last": round(sum(g == n for g, n in zip(gold, n_options, strict=True)) / rows, 4),
        "most_frequent_position": {"position": position, "accuracy": round(hits / rows, 4)},
        "expected_random": round(sum(1 / n for n in n_options) / rows, 4),
    }


def position_leakage(gold: list[int], n_options: list[int]) -> dict:
    """Largest fixed-position gold share on slates of 3+ options (see module docstring).

    >>> position_leakage([4] * 95 + [1] * 5, [4] * 100)["severity"]
    'high'
    >>> position_leakage([1] * 45 + [2, 3, 4] * 18 + [2], [4] * 100)["severity"]
    'none'
    """
    pairs = [(g, n) for g, n in zip(gold, n_options, strict=True) if n >= 3]
    candidates = []
    if len(pairs) >= MIN_ROWS:
        for label, hit in (("first", lambda g, n: g == 1), ("last", lambda g, n: g == n)):
            share = sum(hit(g, n) for g, n in pairs) / len(pairs)
            chance = sum(1 / n for _, n in pairs) / len(pairs)
            candidates.append((share, f"{label} position, slates of 3+", chance, len(pairs)))
    for size, count in Counter(n for _, n in pairs).items():
        if count >= MIN_ROWS:
            shares = Counter(g for g, n in pairs if n == size)
            position, hits = max(shares.items(), key=lambda item: item[1])
            candidates.append((hits / count, f"position {position} of {size}", 1 / size, count))
    if not candidates:
        return {"severity": "none", "evidence": f"fewer than {MIN_ROWS} rows with 3+ options"}
    share, where, chance, rows = max(candidates)
    return {
        "severity": _severity(share, POSITION_THRESHOLDS),
        "position_preference": share >= 1.25 * chance,
        "share": round(share, 4),
        "chance": round(chance, 4),
        "where": where,
        "rows": rows,
        "evidence": f"gold at {where} in {share:.1%} of {rows} rows (chance {chance:.1%})",
    }


def _pattern(item: dict) -> tuple[bool, ...]:
    return tuple(item.get(name) is None for name in METADATA_FIELDS)


def _unique_share(slates: list[list[dict]], picks: list[int]) -> float:
    unique = 0
    for slate, pick in zip(slates, picks, strict=True):
        others = {_pattern(item) for j, item in enumerate(slate) if j != pick}
        unique += _pattern(slate[pick]) not in others
    return unique / len(slates)


def metadata_leakage(slates: list[list[dict]], gold: list[int]) -> dict:
    """Does the gold option's missing-field pattern single it out? (see module docstring)

    >>> full = {f: 1 for f in METADATA_FIELDS}
    >>> bare = full | {"channel": None, "duration_seconds": None}
    >>> metadata_leakage([[full, full, bare]] * 40, [3] * 40)["severity"]
    'high'
    >>> metadata_leakage([[full, full, bare]] * 40, [1] * 40)["severity"]
    'none'
    """
    pairs = [(s, g - 1) for s, g in zip(slates, gold, strict=True) if len(s) >= 2]
    if len(pairs) < MIN_ROWS:
        return {"severity": "none", "evidence": f"fewer than {MIN_ROWS} rows with 2+ options"}
    slates_, picks = [s for s, _ in pairs], [g for _, g in pairs]
    gold_share = _unique_share(slates_, picks)
    decoy_share = _unique_share(slates_, [(g + 1) % len(s) for s, g in pairs])
    excess = gold_share - decoy_share
    missing = {
        name: {
            "gold": round(sum(s[g].get(name) is None for s, g in pairs) / len(pairs), 4),
            "others": round(
                sum(item.get(name) is None for s, g in pairs for j, item in enumerate(s) if j != g)
                / sum(len(s) - 1 for s, _ in pairs),
                4,
            ),
        }
        for name in METADATA_FIELDS
    }
    return {
        "severity": _severity(excess, METADATA_THRESHOLDS),
        "gold_unique_share": round(gold_share, 4),
        "decoy_unique_share": round(decoy_share, 4),
        "excess": round(excess, 4),
        "missing_rate": missing,
        "rows": len(pairs),
        "evidence": (
            f"gold's missing-field pattern is unique in {gold_share:.1%} of rows vs "
            f"{decoy_share:.1%} for a decoy option (excess {excess:+.1%})"
        ),
    }


def group_audit(rows: list[dict]) -> dict:
    """Statistics and detectors for one group of rows (dicts with the contract's columns)."""
    gold = [r["gold_index"] for r in rows]
    n_options = [r["n_options"] for r in rows]
    return {
        "rows": len(rows),
        "participants": len({r["participant_id"] for r in rows}),
        "slate_sizes": dict(sorted(Counter(n_options).items())),
        "gold_positions": dict(sorted(Counter(gold).items())),
        "baselines": position_baselines(gold, n_options),
        "detectors": {
            "position_leakage": position_leakage(gold, n_options),
            "metadata_leakage": metadata_leakage([r["slate"] for r in rows], gold),
        },
    }


def audit_table(table: pa.Table) -> dict:
    """The audit of a table in the contract: per issue/study group, and for all rows."""
    rows = table.select(
        ["participant_id", "issue", "study", "gold_index", "n_options", "slate"]
    ).to_pylist()
    if not rows:
        return {"groups": {}, "leakage": []}
    keys = sorted({f"{r['issue']}/{r['study']}" for r in rows})
    groups = {"all": group_audit(rows)}
    for key in keys:
        groups[key] = group_audit([r for r in rows if f"{r['issue']}/{r['study']}" == key])
    leakage = [
        f"{key}: {name} {found['severity']} ({found['evidence']})"
        for key, group in groups.items()
        for name, found in group["detectors"].items()
        if found["severity"] != "none"
    ]
    return {"groups": groups, "leakage": leakage}


def audit(path: str | Path, json_out: str | Path | None = None) -> dict:
    """Audit a cleaned folder or parquet file; optionally write the JSON report."""
    from grail.core.outputs import write_own_file

    report = audit_table(read_dataset(path))
    if json_out:
        text = json.dumps(report | {"written_by": WRITER}, indent=2, sort_keys=True) + "\n"
        write_own_file(json_out, text, "audit", written_by_audit)
    return report


def audit_text(path: str | Path, json_out: str | Path | None = None) -> str:
    """What ``grail audit`` prints: the :func:`audit` of a cleaned folder or parquet file (its
    JSON report also written to `json_out`) as Markdown."""
    return audit_markdown(audit(path, json_out=json_out))


WRITER = "grail audit"  # the JSON report's own mark: a rerun replaces only a file holding it


def written_by_audit(path: Path) -> bool:
    if path.stat().st_size > 50 << 20:
        return False
    try:
        found = json.loads(path.read_bytes())
    except ValueError:
        return False
    return isinstance(found, dict) and found.get("written_by") == WRITER


def audit_markdown(report: dict) -> str:
    """A readable Markdown report of :func:`grail.tasks.slate.audit.audit`."""
    lines = ["# Data audit"] + _accounting(report.get("accounting"))
    groups = report["groups"]
    baselines = []
    for key, group in groups.items():
        b = group["baselines"]
        mf = b["most_frequent_position"]
        baselines.append(
            [key, group["rows"], group["participants"], f"{b['expected_random']:.3f}"]
            + [f"{b['always_first']:.3f}", f"{b['always_last']:.3f}"]
            + [f"{mf['accuracy']:.3f} ({mf['position']})"]
        )
    columns = ["group", "rows", "participants", "random", "always first", "always last"]
    lines += section(
        "Position baselines (accuracy)",
        *table(columns + ["most frequent (pos)"], baselines, right=6),
    )
    sizes = [
        [k, histogram(g["slate_sizes"]), histogram(g["gold_positions"])] for k, g in groups.items()
    ]
    lines += section(
        "Slate sizes and gold positions",
        *table(["group", "slate sizes", "gold positions"], sizes),
    )
    found = []
    for key, group in groups.items():
        for name, detector in group["detectors"].items():
            human = detector.get("position_preference") and detector["severity"] == "none"
            note = " (human position preference, not leakage)" if human else ""
            found.append([key, name, detector["severity"], detector["evidence"] + note])
    lines += section(
        "Leakage detectors", *table(["group", "detector", "severity", "evidence"], found)
    )
    return "\n".join(
        [
            *lines,
            "",
            "Rules: see `grail audit --help` or the docstring of `grail.tasks.slate.audit`.",
            "",
        ]
    )


def _accounting(accounting: dict | None) -> list[str]:
    if not accounting:
        return []
    lines = [
        "",
        "## Accounting",
        "",
        f"- rows in: {accounting['rows_in']}, kept: {accounting['rows_kept']}, dropped: "
        + counts_text(accounting["rows_dropped"]),
        f"- participants in: {accounting['participants_in']}, kept: "
        f"{accounting['participants_kept']}, dropped: "
        + counts_text(accounting["participants_dropped"]),
    ]
    if "rows_by_split" in accounting:
        lines.append("- rows by split: " + counts_text(accounting["rows_by_split"]))
    lines += [f"- **warning**: {warning}" for warning in accounting.get("warnings", [])]
    return lines
