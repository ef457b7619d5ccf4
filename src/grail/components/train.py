"""KFP components for stage train: the tiny starting models of the embedded default (built
once per run), and GRPO or GRAIL for one issue."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from grail.images import IMAGE, TRAIN_IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def tiny_models(dataset: Input[Dataset], tiny_model: bool, models: Output[Model]):
    """With `tiny_model`: the offline tiny policy and discriminator built from the dataset, the
    one starting point of every branch (so GRPO and GRAIL start from the same weights);
    without it, an empty folder."""
    from grail.tasks import tiny_models_task

    tiny_models_task(dataset.path, tiny_model, models.path)


@dsl.component(base_image=TRAIN_IMAGE, install_kfp_package=False)
def train(
    dataset: Input[Dataset],
    base_models: Input[Model],
    recipe: str,
    overrides: str,
    issue: str,
    algorithm: str,
    tiny_model: bool,
    checkpoint_uri: str,
    checkpoint_key: str,
    kfp_run_id: str,
    parent_run: str,
    model: Output[Model],
    metrics: Output[Metrics],
    generated: Input[Dataset] = None,
):
    """Train the issue's model; with `generated` (a generate output) an SFT warm-start first."""
    import json

    from grail.tasks import train_task

    if generated is not None:
        overrides = json.dumps(json.loads(overrides or "{}") | {"sft_dataset": generated.path})
    final = train_task(
        dataset.path,
        recipe,
        overrides,
        issue,
        algorithm,
        base_models.path if tiny_model else "",
        checkpoint_uri,
        checkpoint_key or kfp_run_id,
        parent_run,
        model.path,
    )
    for name, value in final.items():
        metrics.log_metric(name, value)
    model.metadata.update({"issue": issue, "algorithm": algorithm})
