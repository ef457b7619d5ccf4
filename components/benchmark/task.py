"""What the benchmark task does: one issue's model (every checkpoint, its starting model as
step 0) against the baselines and references, the task's headline logged to the parent run."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from grail.core import tracking
from grail.core.errors import reported
from grail.core.progress import show_progress
from grail.core.run_notes import best_baseline_tag
from grail.tasks import TASKS, short_name
from grail.tasks.headline import CLONED


@reported("benchmark")
def benchmark_task(
    *,
    dataset: str,
    model: str,
    base_models: str,
    issue: str,
    algorithm: str,
    references: str,
    limit: int,
    reads_rows: int,
    max_new_tokens: int,
    parent: str,
    out: str,
    task: str,
) -> dict:
    """Benchmark one issue's model (its starting model as step 0, every checkpoint) plus the
    reference models; returns the final systems' metrics under their stable names
    (``trained/accuracy``, ``baseline/ranker/log_loss``, ...) and logs the task's headline to
    the pipeline's parent run as ``ISSUE/ALGORITHM/FIELD``; a collapsed model is tagged there.

    The task (`task`) says which rows the branch is benchmarked on (``branch_rows``: the slate
    task's issue, the summarize task's every document), how they are scored (``benchmark``)
    and what of it is returned (``benchmark_metrics``, ``benchmark_fields``, ``headline``)."""
    from grail.benchmark.stage import run

    show_progress()  # the task's log shows a line per model and completions every 10 s
    specs = json.loads(references or "[]")
    trained = f"{algorithm}-{short_name(issue)}"
    params = {"issue": issue, "algorithm": algorithm, "limit": limit, "reads_rows": reads_rows}
    params |= {"references": references} if specs else {}
    params |= {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
    with tempfile.TemporaryDirectory(prefix="grail-bench-") as tmp:
        named = Path(tmp) / trained
        named.symlink_to(Path(model).resolve(), target_is_directory=True)
        specs += cloned_warm_start(Path(model), Path(tmp), trained)
        with tracking.stage_run(parent, f"benchmark:{issue}:{algorithm}", params):
            rows, label = TASKS[task].branch_rows(Path(dataset), issue, Path(tmp) / "data")
            result = run(
                rows,
                out,
                task=task,
                label=label,
                models=[str(named), *specs],
                limit=limit or None,
                reads_rows=reads_rows,
                max_new_tokens=max_new_tokens or None,  # 0: as the model was trained
                trained=trained,
                start_model=str(Path(base_models) / "policy") if base_models else None,
                branch={"issue": issue, "algorithm": algorithm},
            )
    summary = TASKS[task].headline(result, trained)
    pipeline_run = tracking.pipeline_parent(parent)
    tracking.log_metrics(
        pipeline_run,
        {  # rounded: the runs table shows what was logged (0.4000000000000001)
            f"{issue}/{algorithm}/{k}": round(v, 4)
            for k, v in summary.items()
            if isinstance(v, int | float)
        },
    )
    named = {best_baseline_tag(issue, algorithm): summary.get("best_baseline")}
    if summary.get("collapsed"):
        named[f"collapsed.{issue}.{algorithm}"] = summary["collapsed"]
    tracking.set_tags(pipeline_run, {k: v for k, v in named.items() if v})
    fields = TASKS[task].benchmark_fields
    return {
        key: value
        for key, value, _ in TASKS[task].benchmark_metrics(result, trained)
        if key.endswith(tuple(f"/{f}" for f in fields)) and "_by_step" not in key
    }


def run_benchmark(
    *,
    dataset,
    model,
    base_models,
    tiny_model: bool,
    issue: str,
    algorithm: str,
    reference_models: str,
    limit: int,
    reads_rows: int,
    max_new_tokens: int,
    parent_run: str,
    results,
    report,
    charts,
    metrics,
    task: str,
) -> None:
    """The benchmark component's body: :func:`benchmark_task` into `results`; the report and
    the charts (one HTML page of the SVGs) also into their own artifacts, to be viewed in the
    Kubeflow UI; the final systems' metrics into `metrics`. The starting model is the tiny
    policy in `base_models` with `tiny_model`, else the one the training run names."""
    final = benchmark_task(
        dataset=dataset.path,
        model=model.path,
        base_models=base_models.path if tiny_model else "",
        issue=issue,
        algorithm=algorithm,
        references=reference_models,
        limit=limit,
        reads_rows=reads_rows,
        max_new_tokens=max_new_tokens,
        parent=parent_run,
        out=results.path,
        task=task,
    )
    shutil.copyfile(Path(results.path) / "report.md", report.path)
    svgs = "".join(p.read_text() for p in sorted(Path(results.path).glob("*.svg")))
    Path(charts.path).write_text(f"<html><body>{svgs}</body></html>")
    for name, value in final.items():  # trained/accuracy, baseline/ranker/accuracy, ...
        metrics.log_metric(name, value)


def cloned_warm_start(model: Path, tmp: Path, trained: str) -> list[str]:
    """The behaviour-cloning warm start RL continued from (``model/sft``), as the model
    ``TRAINED-cloned``, when the training had one (none for GRPO from the start, or BC alone)."""
    cloned = model / "sft"
    if not (cloned / "prompt.json").is_file():
        return []
    (tmp / f"{trained}{CLONED}").symlink_to(cloned.resolve(), target_is_directory=True)
    return [str(tmp / f"{trained}{CLONED}")]
