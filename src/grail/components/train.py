"""KFP component for stage train: GRPO or GRAIL for one issue."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from grail.images import TRAIN_IMAGE


@dsl.component(base_image=TRAIN_IMAGE, install_kfp_package=False)
def train(
    dataset: Input[Dataset],
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
        tiny_model,
        checkpoint_uri,
        checkpoint_key or kfp_run_id,
        parent_run,
        model.path,
    )
    for name, value in final.items():
        metrics.log_metric(name, value)
    model.metadata.update({"issue": issue, "algorithm": algorithm})
