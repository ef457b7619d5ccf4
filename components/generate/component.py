"""KFP component for stage generate: completions from a model server, scored (distilabel)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Output

from grail.core.images import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def generate(
    dataset: Input[Dataset],
    model: str,
    num_generations: int,
    limit: int,
    parent_run: str,
    generated: Output[Dataset],
    metrics: Output[Metrics],
):
    """Generated completions, SFT conversations and preference pairs for the train split."""
    from grail.components.generate.task import generate_task

    summary = generate_task(dataset.path, model, num_generations, limit, parent_run, generated.path)
    for name in ("generated", "failures", "acceptance_rate", "parse_rate"):
        metrics.log_metric(name, summary[name])
