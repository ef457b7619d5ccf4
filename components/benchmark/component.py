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
    reads_rows: int,
    max_new_tokens: int,
    parent_run: str,
    results: Output[Artifact],
    report: Output[Markdown],
    charts: Output[HTML],
    metrics: Output[Metrics],
    task: str = "slate",
):
    """Benchmark one branch's model at every checkpoint against the baselines, the ceiling
    and the reference models, on the issue's validation rows.

    Args:
        dataset: The cleaned dataset (the clean component's output).
        model: The trained model with its checkpoints (the train component's model).
        base_models: The tiny starting models (the tiny-models component's output).
        tiny_model: Score the tiny policy in base_models as step 0; otherwise the model the
            training run names in its summary.
        issue: The branch's issue (gun_control, minimum_wage).
        algorithm: The branch's algorithm (grpo, grail, bc).
        reference_models: JSON list of model specs to score beside it (openai:NAME@URL, ...).
        limit: The first N validation rows (0: all).
        reads_rows: Task slate: the first N of them each model and the ranker answer again
            with the viewer's lines, then the options, swapped (does it read? 0: none).
        max_new_tokens: Tokens per answer (0: as the model was trained).
        parent_run: The pipeline's parent MLflow run ("" when tracking is off).
        results: Every benchmark output: metrics.json, predictions.parquet, report.md, charts.
        report: The report as Markdown, viewable in the Kubeflow UI.
        charts: The charts (accuracy by model, accuracy and log-loss by step) as one page.
        metrics: The final systems' metrics (trained/accuracy, baseline/ranker/log_loss, ...).
        task: slate, or summarize: the documents scored by the hidden questions a reader
            answers from each system's summary (limit: the first N validation documents).
    """
    from grail.components.benchmark.task import run_benchmark

    run_benchmark(
        dataset=dataset,
        model=model,
        base_models=base_models,
        tiny_model=tiny_model,
        issue=issue,
        algorithm=algorithm,
        reference_models=reference_models,
        limit=limit,
        reads_rows=reads_rows,
        max_new_tokens=max_new_tokens,
        parent_run=parent_run,
        results=results,
        report=report,
        charts=charts,
        metrics=metrics,
        task=task,
    )
