"""The promotion gate: after a branch's benchmark, whether its model may become the registered
model's ``champion``. The pipeline's ``promote_if`` picks the rule: ``beats_prior`` (the
default) asks the task (its ``promotion`` part: the slate simulator's held-out log-loss below
always-first's with a paired interval, no collapse; the summarizer's share answered above the
best baseline by its interval), ``always`` and ``never`` decide without it. A model that is not
promoted is still exported (``promoted: false`` and the reason in its manifest); only a promoted
one gets the alias."""

from __future__ import annotations

import json
from pathlib import Path

from grail.core.errors import GrailError
from grail.core.outputs import read_record, sha256
from grail.tasks import DEFAULT_TASK, TASKS

RULES = ("beats_prior", "always", "never")
ALIAS = "champion"  # the registered model's alias a promoted version gets
DECISION = "decision.json"


def decide(headline: dict, task: str, rule: str, model: str = "") -> dict:
    """The gate's decision on a benchmark's headline (the task's ``headline`` part,
    :func:`grail.benchmark.stage.headline`) of a model of `task` under `rule`:
    ``{"promoted", "rule", "reason", "model"}``.

    >>> decide({}, "slate", "never")["reason"], decide({}, "slate", "beats_prior")["promoted"]
    ('promote_if: never', False)
    """
    if rule not in RULES:
        raise GrailError(f"promote_if: {rule!r} is none of {', '.join(RULES)}")
    decision = {"rule": rule, "model": model}
    if rule != "beats_prior":
        return decision | {"promoted": rule == "always", "reason": f"promote_if: {rule}"}
    promoted, reason = TASKS[task or DEFAULT_TASK].promotion(headline)
    return decision | {"promoted": promoted, "reason": reason}


def read_decision(
    path: str | Path | None, results: str | Path | None = None, summary: dict | None = None
) -> dict | None:
    """A gate's decision written by :func:`gate` (a file, or a folder holding `DECISION`); None
    when `path` is None (an export with no gate before it). Its fields are checked, and with
    `results` (the benchmark folder of the branch being exported) that it was decided on that
    benchmark (the sha256 of its ``metrics.json``) about the model it trained, and, given that
    benchmark's headline (`summary`), that its rule decides the same on it: a decision copied
    from another branch or run, or edited by hand, is refused in one line."""
    if path is None:
        return None
    path = Path(path)
    path = path / DECISION if path.is_dir() else path
    try:
        decision = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise GrailError(f"{path}: not a promotion decision ({error})") from None
    if not isinstance(decision, dict) or not isinstance(decision.get("promoted"), bool):
        raise GrailError(f"{path}: not a promotion decision (no promoted: true or false)")
    for field in ("reason", "rule", "model"):
        if not isinstance(decision.get(field), str):
            raise GrailError(f"{path}: not a promotion decision ({field} is not text)")
    if results is not None:
        metrics = Path(results) / "metrics.json"
        result = read_record(metrics, "a benchmark's metrics")
        trained = result.get("trained")
        if decision.get("benchmark") != sha256(metrics) or decision["model"] != trained:
            raise GrailError(
                f"{path}: decided on another benchmark than {results} (model "
                f"{decision['model']!r}, this branch's {trained!r}; or its metrics.json "
                "changed since); nothing was exported"
            )
    if results is not None and summary is not None:
        again = decide(summary, result.get("task", ""), decision["rule"], trained)
        if (again["promoted"], again["reason"]) != (decision["promoted"], decision["reason"]):
            raise GrailError(
                f"{path}: says promoted: {str(decision['promoted']).lower()}, but its rule "
                f"({decision['rule']}) gives {str(again['promoted']).lower()} on that "
                "benchmark (edited by hand?); nothing was exported"
            )
    return decision


def in_words(decision: dict | None) -> str:
    """The decision as the closing table says it.

    >>> in_words({"promoted": False, "reason": "no better than always-first: log-loss +0.000"})
    'not promoted: no better than always-first: log-loss +0.000'
    >>> in_words({"promoted": True, "reason": "promote_if: always"}), in_words(None)
    ('promoted (champion): promote_if: always', '')
    """
    if decision is None:
        return ""
    head = f"promoted ({ALIAS})" if decision["promoted"] else "not promoted"
    return f"{head}: {decision['reason']}"
