"""KFP components for stage train: the tiny starting models of the embedded default (built
once per run), and GRPO or GRAIL for one issue."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from grail.core.images import IMAGE, TRAIN_IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def tiny_models(
    dataset: Input[Dataset],
    tiny_model: bool,
    models: Output[Model],
    task: str = "slate",
    recipe: str = "",
    overrides: str = "{}",
    branches: list = [],  # noqa: B006 (a KFP default value)
):
    """Build the embedded default's offline tiny policy (and classifier) once per run, the one
    starting point of every branch (so GRPO and GRAIL start from the same weights), and, where
    the branches' recipe clones, one warm start per issue that they adopt.

    Args:
        dataset: The cleaned dataset, whose prompts train the tiny tokenizer.
        tiny_model: Build them; otherwise the output is an empty folder.
        models: policy/, discriminator/ where a GRAIL branch reads a classifier
            (gail_discriminator: classifier), and warm_starts/ISSUE/sft where the recipe
            clones, or nothing.
        task: slate, or summarize (a tiny summarizer warmed up on the documents' format).
        recipe: The branches' recipe path ({algorithm} and {issue} filled in per branch).
        overrides: JSON object of recipe fields to override.
        branches: The run's branches (issue, algorithm): one warm start per issue.
    """
    from grail.components.train.task import run_tiny_models

    run_tiny_models(
        dataset=dataset,
        tiny_model=tiny_model,
        models=models,
        task=task,
        recipe=recipe,
        overrides=overrides,
        branches=branches,
    )


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
    """Train one issue's model with GRPO or GRAIL (TRL's GRPOTrainer), checkpoints to object
    storage after every save; with generated, an SFT warm start first.

    Args:
        dataset: The cleaned dataset (the clean component's output).
        base_models: The tiny starting models (the tiny-models component's output).
        recipe: A recipe path or shipped name; {algorithm} and {issue} are filled in.
        overrides: JSON object of recipe fields that replace the recipe's.
        issue: The branch's issue (gun_control, minimum_wage), or "summarize" in the summarize
            task's DAG (the recipe's task: summarize says how its documents are read).
        algorithm: The branch's algorithm (grpo, grail, bc).
        tiny_model: Train the tiny models in base_models instead of the recipe's.
        checkpoint_uri: Where checkpoints go (s3://...); empty keeps them in the pod.
        checkpoint_key: The run's key under checkpoint_uri; empty uses kfp_run_id, so a
            retried pod resumes its own run and a rerun starts fresh.
        kfp_run_id: The KFP run's id.
        parent_run: The pipeline's parent MLflow run ("" when tracking is off).
        model: The final model, its metrics.json and summary.json (no resume state).
        metrics: The last logged loss, reward, KL and step.
        generated: A generate output: its SFT conversations warm-start the policy.
        backend: pod trains in this task's pod; trainjob as a Kubeflow Trainer TrainJob.
        nodes: TrainJob nodes (backend trainjob).
        train_image: The TrainJob's image (backend trainjob).
        gpu_type: The GPU resource name.
        gpu_count: GPUs per pod or TrainJob node.
        node_selector: The GPU pool's node selector (backend trainjob).
        tolerations: The GPU pool's tolerations (backend trainjob).
        cpu: CPU request per TrainJob node.
        memory: Memory request per TrainJob node.
        s3_secret: The Kubernetes secret with the S3 keys of the TrainJob's pods.
        mlflow_secret: The Kubernetes secret with the MLflow keys of the TrainJob's pods.
    """
    from grail.components.train.task import run_train

    run_train(
        dataset=dataset,
        base_models=base_models,
        recipe=recipe,
        overrides=overrides,
        issue=issue,
        algorithm=algorithm,
        tiny_model=tiny_model,
        checkpoint_uri=checkpoint_uri,
        checkpoint_key=checkpoint_key,
        kfp_run_id=kfp_run_id,
        parent_run=parent_run,
        model=model,
        metrics=metrics,
        generated=generated,
        backend=backend,
        nodes=nodes,
        train_image=train_image,
        gpu_type=gpu_type,
        gpu_count=gpu_count,
        node_selector=node_selector,
        tolerations=tolerations,
        cpu=cpu,
        memory=memory,
        s3_secret=s3_secret,
        mlflow_secret=mlflow_secret,
    )
