"""What every task's benchmark headline shares: the stem of a system's metric keys
(:func:`role`), the name of a trained model's behaviour-cloned warm start (:data:`CLONED`) and
the checkpoint chosen for export as headline fields (:func:`chosen_fields`); and how a task's
closing table (``grail run --local``) writes a figure, a paired change and the exported
checkpoint."""

from __future__ import annotations

import re

CLONED = "-cloned"  # the benchmark's name for a trained model's warm start: TRAINED-cloned


def identifier(name: str) -> str:
    """A system's name as a metric-key part: no spaces, no parenthesised remark.

    >>> identifier("random (expected)"), identifier("Qwen/Qwen2.5-1.5B-Instruct@host:8000")
    ('random', 'Qwen_Qwen2.5-1.5B-Instruct_host_8000')
    """
    return re.sub(r"[^\w\-.]+", "_", name.split(" (")[0]).strip("_")


def role(name: str, entry: dict, trained: str | None, ceilings: dict | None = None) -> str:
    """What a system is, as the stem of its metric keys: ``trained`` (the model this run
    trained), ``cloned`` (its behaviour-cloned warm start, ``TRAINED-cloned``), ``baseline/ID``,
    ``ceiling/ID`` (what the study's own choice model knows) or ``model/ID`` (a reference
    model). Stable across runs and algorithms (which stay the runs' params), so MLflow's
    compare view lines two runs up column by column. `ceilings`: a task's ceilings' ids by
    name (the slate task's, which its study's own choice model knows).

    >>> role("grpo-gun-cloned", {"kind": "model"}, "grpo-gun")
    'cloned'
    >>> role("Qwen/Qwen2.5-1.5B-Instruct", {"kind": "model"}, "grpo-gun")
    'model/Qwen_Qwen2.5-1.5B-Instruct'
    """
    series = entry.get("series") or name
    if trained is not None and series == trained:
        return "trained"
    if trained is not None and series == f"{trained}{CLONED}":
        return "cloned"
    if name in (ceilings or {}):
        return f"ceiling/{ceilings[name]}"
    if entry["kind"] == "ceiling":
        return f"ceiling/{identifier(name)}"
    if entry["kind"] in ("baseline", "expected"):
        return f"baseline/{identifier(name)}"
    return f"model/{identifier(series)}"


def chosen_fields(result: dict) -> dict:
    """The checkpoint chosen for export (:mod:`grail.core.selection`), as headline fields
    ``exported_step``, ``last_step`` and ``exported_reason``; none for a benchmark without one.

    >>> chosen_fields({"chosen": {"step": 2, "last_step": 4, "reason": "step 2 beats"}})
    {'exported_step': 2, 'last_step': 4, 'exported_reason': 'step 2 beats'}
    """
    chosen = result.get("chosen")
    if not chosen:
        return {}
    return {
        "exported_step": chosen["step"],
        "last_step": chosen["last_step"],
        "exported_reason": chosen["reason"],
    }


def number(row: dict, key: str, digits: int = 3) -> str:
    """A headline figure as a closing table writes it ("-" when not measured)."""
    return f"{row[key]:.{digits}f}" if row.get(key) is not None else "-"


def change(row: dict, metric: str, against: str = "start") -> str:
    """The final model minus step 0 (or the best baseline) on `metric`, with its interval ("-"
    when not measured)."""
    key = f"final_minus_{against}/{metric}"
    if row.get(f"{key}_difference") is None:
        return "-"
    low, high = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
    ci = f" [{low:+.3f}, {high:+.3f}]" if low is not None else ""
    return f"{row[f'{key}_difference']:+.3f}{ci}"


def exported_line(r: dict) -> str:
    """Which checkpoint the export takes, and why (:mod:`grail.core.selection`).

    >>> exported_line({"exported_step": 4, "exported_reason": "the last checkpoint (step 4) "
    ...     "has the best log-loss"})
    'exported: step 4, the last checkpoint (step 4) has the best log-loss'
    """
    return f"exported: step {r['exported_step']}, {r['exported_reason']}"
