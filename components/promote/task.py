"""What the promote task does: the promotion gate's decision on one branch's benchmark
(:mod:`grail.export.promotion`), into an artifact, the task's output and the parent MLflow
run."""

from __future__ import annotations

import json
from pathlib import Path

from grail.core import tracking
from grail.core.errors import GrailError, reported
from grail.core.outputs import check_complete, sha256


def gate(results: str | Path, rule: str, out: str | Path) -> dict:
    """:func:`grail.export.promotion.decide` on the benchmark output folder `results` (its
    ``metrics.json``, as the benchmark wrote it), written to `out` (JSON) with the sha256 of
    the metrics it decided on (``benchmark``)."""
    from grail.benchmark.stage import headline
    from grail.export.promotion import decide

    path = Path(results) / "metrics.json"
    if not path.is_file():
        raise GrailError(f"{path}: no benchmark metrics to decide the promotion on")
    check_complete(Path(results))  # a metrics.json edited since the benchmark wrote it: refused
    result = json.loads(path.read_text())
    decision = decide(headline(result), result.get("task", ""), rule, result["trained"])
    decision["benchmark"] = sha256(path)  # the export checks it decided on its benchmark
    Path(out).write_text(json.dumps(decision, indent=1))
    return decision


@reported("promote")
def promote_task(*, results: str, rule: str, issue: str, algorithm: str, parent: str,
                 out: str) -> dict:  # fmt: skip
    """The decision (:func:`gate`) to `out`, tagged on the pipeline's
    parent run as ``promotion/ISSUE/ALGORITHM`` ("promoted: ..." or "not promoted: ...")."""
    from grail.export.promotion import in_words

    decision = gate(results, rule, out)
    tracking.set_tags(
        tracking.pipeline_parent(parent), {f"promotion/{issue}/{algorithm}": in_words(decision)}
    )
    return decision


def run_promote(*, results, promote_if: str, issue: str, algorithm: str, parent_run: str,
                decision, metrics) -> tuple[bool, str]:  # fmt: skip
    """The promote component's body: :func:`promote_task` on the `results` artifact into the
    `decision` artifact; ``promoted`` (1 or 0) into `metrics`; returns (promoted, reason)."""
    decided = promote_task(
        results=results.path,
        rule=promote_if,
        issue=issue,
        algorithm=algorithm,
        parent=parent_run,
        out=decision.path,
    )
    metrics.log_metric("promoted", int(decided["promoted"]))
    return decided["promoted"], decided["reason"]
