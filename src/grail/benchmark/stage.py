"""Stage ``benchmark``: every task's models, baselines and ceilings on a split, scored the
task's way; a report, charts and metrics.

Run: ``grail benchmark --data data/ --out results/ [--task slate|summarize] [--model SPEC ...]
[--split validation] [--limit N]``.

The stage looks the task up (:data:`grail.tasks.TASKS`) and runs its ``benchmark`` part: the
slate task's (:mod:`grail.tasks.slate.benchmark.run`: choices from slates, scored as simulators
of people) or the summarize task's (:mod:`grail.tasks.summarize.benchmark`: summaries, scored
by the hidden questions a reader answers from them). Each writes ``metrics.json``,
``report.md`` and charts under ``--out`` and logs them to MLflow when
``MLFLOW_TRACKING_URI`` is set. ``grail compare`` (:func:`compare`) runs the task's comparison
of algorithms on benchmark outputs.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from grail.benchmark.config import BenchmarkConfig
from grail.core.errors import GrailError
from grail.tasks import DEFAULT_TASK, TASKS, TaskEntry, recorded_task


def run(
    data: str | Path,
    out: str | Path,
    options=None,
    prompt: dict | None = None,
    label: str | None = None,
    trained: str | None = None,
    branch: dict | None = None,
    **settings,
) -> dict:
    """Run the stage; returns the metrics (also written to ``out/metrics.json``).

    `settings`: the other :class:`BenchmarkConfig` fields. ``options`` (the prompt options, a
    dataclass) overrides every prompt setting, ``prompt`` the ones it names. ``label`` names the
    data in the report. ``trained`` names the model (its series) this run is about: MLflow gets
    it as ``trained``, the other models as ``model/NAME``. ``branch`` (issue, algorithm) is
    recorded for the comparison of algorithms (:func:`compare`)."""
    config = BenchmarkConfig(data=str(data), out=str(out), **settings)
    # Each model is asked the way it was trained (its prompt.json) unless told otherwise:
    # `options` overrides every prompt setting, `prompt` the ones it names.
    overrides = dict(prompt or {}) | (asdict(options) if options is not None else {})
    return TASKS[config.task].benchmark(config, overrides, label, trained, branch)


def scored_by(results: list[str | Path]) -> TaskEntry:
    """The task whose benchmark wrote `results` (the first one's ``metrics.json``; the slate
    task where it names none)."""
    return TASKS[recorded_task(results[0] if results else None, "metrics.json")]


def headline(result: dict, trained: str | None = None) -> dict:
    """A benchmark's headline (``metrics.json`` as `result`), its task's way: the trained model
    (default: the one the benchmark names) against its references."""
    task = TASKS[result.get("task", DEFAULT_TASK)]
    return task.headline(result, trained or result["trained"])


def compare(results: list[str], out: str | Path, bootstrap: int = 1000) -> dict:
    """``grail compare``: the algorithms of one run compared per issue (the task's ``compare``
    part, paired on the same rows); ``comparison.json`` and ``comparison.md`` into `out`."""
    task = scored_by(results)
    if task.compare is None:
        raise GrailError(f"the {task.name} task has no comparison of algorithms")
    return task.compare(results, out, bootstrap)
