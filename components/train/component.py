"""KFP components for stage train: the tiny starting models of the embedded default (built
once per run), and GRPO or GRAIL for one issue."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from grail.core.images import IMAGE, TRAIN_IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def tiny_models(dataset: Input[Dataset], tiny_model: bool, models: Output[Model]):
    """With `tiny_model`: the offline tiny policy and discriminator built from the dataset, the
    one starting point of every branch (so GRPO and GRAIL start from the same weights);
    without it, an empty folder."""
    from grail.components.train.task import tiny_models_task

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
    backend: str = "pod",
    nodes: int = 1,
    train_image: str = "",
    gpu_type: str = "nvidia.com/gpu",
    gpu_count: str = "1",
    node_selector: dict = {},  # noqa: B006 (a KFP default value)
    tolerations: list = [],  # noqa: B006 (a KFP default value)
    cpu: str = "8",
    memory: str = "64Gi",
    s3_secret: str = "",
    mlflow_secret: str = "",
):
    """Train the issue's model; with `generated` (a generate output) an SFT warm-start first.

    `backend` "pod" trains in this task's pod; "trainjob" runs the same training as a Kubeflow
    Trainer TrainJob of `nodes` x `gpu_count` GPUs (`train_image`, the pool's selector,
    tolerations, requests and secrets) and collects its model (grail.components.train.trainjob).
    """
    import json

    from grail.components.train.task import train_task

    if generated is not None:
        overrides = json.dumps(json.loads(overrides or "{}") | {"sft_dataset": generated.path})
    runner = None
    if backend != "pod":
        from grail.components.train.trainjob import TrainPool, runner_for

        pool = TrainPool(
            image=train_image,
            nodes=nodes,
            gpu_type=gpu_type,
            gpus_per_node=int(gpu_count),
            cpu=cpu,
            memory=memory,
            node_selector=node_selector,
            tolerations=tolerations,
        )
        starting = tiny_model or generated is not None  # models only this pod has
        secrets = {"s3": s3_secret, "mlflow": mlflow_secret}
        runner = runner_for(
            backend, pool, model.path, (kfp_run_id, issue, algorithm), starting, secrets
        )
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
        runner,
    )
    for name, value in final.items():
        metrics.log_metric(name, value)
    model.metadata.update({"issue": issue, "algorithm": algorithm})
