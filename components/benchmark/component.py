"""KFP component for stage benchmark: baselines, the model at every checkpoint, references."""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from grail.core.images import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def benchmark(
    dataset: Input[Dataset],
    model: Input[Model],
    base_models: Input[Model],
    tiny_model: bool,
    issue: str,
    algorithm: str,
    reference_models: str,
    limit: int,
    max_new_tokens: int,
    parent_run: str,
    results: Output[Artifact],
    report: Output[Markdown],
    charts: Output[HTML],
    metrics: Output[Metrics],
):
    """All benchmark outputs in `results`; the report and charts also as viewable artifacts.
    The starting model is scored as step 0: the tiny policy in `base_models` with
    `tiny_model`, else the model the training run names in its summary."""
    import shutil
    from pathlib import Path

    from grail.components.benchmark.task import benchmark_task

    final = benchmark_task(
        dataset.path,
        model.path,
        base_models.path if tiny_model else "",
        issue,
        algorithm,
        reference_models,
        limit,
        max_new_tokens,
        parent_run,
        results.path,
    )
    shutil.copyfile(Path(results.path) / "report.md", report.path)
    svgs = "".join(p.read_text() for p in sorted(Path(results.path).glob("*.svg")))
    Path(charts.path).write_text(f"<html><body>{svgs}</body></html>")
    for name, value in final.items():  # trained/accuracy, baseline/ranker/accuracy, ...
        metrics.log_metric(name, value)
