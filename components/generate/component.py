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
    prompt: str = "{}",
):
    """Generate completions for the train split with distilabel, scored by the rewards.

    Args:
        dataset: The cleaned dataset (the clean component's output).
        model: The model server: openai:NAME@URL (vLLM, transformers serve) or openai:NAME.
        num_generations: Completions per prompt.
        limit: The first N prompts of the train split (0: all).
        prompt: JSON of how the teacher is asked, as the recipe trains (the summarize task's
            summary_mode, summary_budget; max_new_tokens); "{}": the defaults.
        parent_run: The pipeline's parent MLflow run ("" when tracking is off).
        generated: Completions with their rewards, SFT conversations and preference pairs.
        metrics: Completions generated, failures, acceptance rate and parse rate.
    """
    from grail.components.generate.task import run_generate

    run_generate(
        dataset=dataset,
        model=model,
        num_generations=num_generations,
        limit=limit,
        parent_run=parent_run,
        generated=generated,
        metrics=metrics,
        prompt=prompt,
    )
