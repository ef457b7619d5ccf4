"""What the train tasks do: the tiny starting models of the embedded default, and one
issue's GRPO or GRAIL training with its MLflow stage run (in this pod or through a runner)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from grail.core import tracking
from grail.core.errors import reported
from grail.core.progress import show_progress
from grail.core.recipes import (
    base_model,
    overrides_to_args,
    overrides_values,
    read_recipe,
    recipe_values,
    resolve_recipe,
)
from grail.core.storage import run_folder
from grail.tasks import TASKS, recorded_task, short_name


@reported("train")
def train_task(
    *,
    dataset: str,
    recipe: str,
    overrides: str,
    issue: str,
    algorithm: str,
    base_models: str,
    checkpoint_uri: str,
    checkpoint_key: str,
    parent: str,
    out: str,
    runner=None,
) -> dict:
    """Train one issue's model into `out`; returns the last logged training metrics.

    `runner` trains elsewhere with the same ``grail train`` arguments (the TrainJob runner of
    ``train_backend=trainjob``); by default training runs in this pod.

    `base_models`: a :func:`tiny_models_task` folder (the embedded default's tiny policy and
    discriminator replace the recipe's models), or "" for the recipe's own.

    Checkpoints go to ``checkpoint_uri/checkpoint_key/algorithm/issue`` and the task resumes
    from the newest one there: with the KFP run id as key, a retried pod continues its own
    run and a rerun from the UI (a new run id) starts fresh; a key the user names resumes
    that run on purpose.
    """
    from grail.train.stage import drop_resume_state, train

    show_progress()  # the tiny model's warm-up and training's own lines
    recipe_path = resolve_recipe(recipe, short_name(issue), algorithm)
    args = training_args(recipe_path, dataset, issue, algorithm, out, base_models, overrides)
    if checkpoint_uri:
        args += [
            "--checkpoint_uri",
            checkpoint_location(checkpoint_uri, checkpoint_key, algorithm, issue),
            "--resume_from_checkpoint",
            "latest",
        ]
    tiny = bool(base_models)
    args += overrides_to_args(overrides)
    values = recipe_values(recipe_path, overrides, tiny)
    params = values | {
        "recipe": recipe_path.name,
        "issue": issue,
        "algorithm": algorithm,
        "base_model": base_model(values, tiny),
    }
    runner = runner or train
    with tracking.stage_run(parent, f"train:{issue}:{algorithm}", params) as run_id:
        # The same entry point as `grail train`: several processes when the pod has
        # several GPUs (accelerate + ZeRO-3), each reporting to this stage's run.
        if run_id:
            with tracking.trainer_params_off():
                runner([*args, "--report_to", "mlflow"])
            log_training(run_id, Path(out), Path(dataset), issue, algorithm)
        else:
            runner(args)
    if checkpoint_uri:  # the KFP model artifact carries models, not resume state
        drop_resume_state(Path(out))
    rows = json.loads((Path(out) / "metrics.json").read_text())
    last = rows[-1] if rows else {}
    return {
        k: float(v)
        for k, v in last.items()
        if isinstance(v, int | float) and k in ("loss", "reward", "kl", "step")
    }


def training_args(
    recipe_path: Path, dataset: str, issue: str, algorithm: str, out: str, base_models: str,
    overrides: str = "{}",
) -> list[str]:  # fmt: skip
    """``grail train``'s arguments for one branch (but for checkpoints and overrides): its
    recipe, data, issue and output; with `base_models` (the embedded default), the tiny
    models (the classifier where the recipe and `overrides` read one) and the warm start the
    tiny-models task cloned for the issue, where it did."""
    args = [
        "--config",
        str(recipe_path),
        "--dataset",
        dataset,
        "--issues",
        issue,
        "--output_dir",
        out,
        "--gail_use",
        json.dumps(algorithm == "grail"),
    ]
    if base_models:  # the embedded default: offline tiny models built from this dataset
        values = read_recipe(recipe_path) | overrides_values(overrides)
        args += tiny_model_args(Path(base_models), reads_classifier(algorithm, values))
        cloned = Path(base_models) / WARM_STARTS / issue / "sft"
        args += ["--sft_reuse", str(cloned)] if cloned.is_dir() else []
    return args


WARM_STARTS = "warm_starts"  # the tiny-models task's clones, one per issue


def log_training(run_id: str, out: Path, dataset: Path, issue: str, algorithm: str) -> None:
    """What a finished training leaves in its stage run: the dataset inputs, and the run's
    summary and metric rows. Not the model: the export task registers the exported one by
    reference (:func:`grail.export.registry.register_export`), so MLflow holds no copy of it."""
    log_datasets(run_id, dataset, issue)
    tracking.log_artifacts(run_id, [out / n for n in ("summary.json", "metrics.json")], "train")
    summary = out / "summary.json"
    forked = json.loads(summary.read_text()).get("forked_from") if summary.is_file() else None
    if forked:  # the checkpoint of another run this one started from (fork_from)
        tracking.set_tags(run_id, {"forked_from": forked})


def tiny_models_task(
    dataset: str, tiny: bool, out: str, task: str, recipe: str = "", overrides: str = "{}",
    branches: list | None = None,
) -> None:  # fmt: skip
    """The embedded default's starting models, built once per run from the dataset: the tiny
    policy (``out/policy``, warmed up for its task's ``warmup_steps``) and, for a task that
    trains GRAIL, the discriminator (``out/discriminator``); then, where the branches' recipe
    clones (:func:`warm_starts`), one warm start per issue that every branch adopts; nothing
    without `tiny`."""
    import torch

    from grail.train.tiny import build_tiny_model

    show_progress()
    Path(out).mkdir(parents=True, exist_ok=True)
    # No other task runs beside this one (the branches wait for its models): every core, not
    # the one thread per process that parallel local branches are given.
    torch.set_num_threads(os.cpu_count() or 1)
    if not tiny:
        return
    steps = TASKS[task].warmup_steps
    build_tiny_model(Path(out) / "policy", data=dataset, format_warmup=steps)
    if TASKS[task].gail and classifier_wanted(recipe, overrides, branches):
        build_tiny_model(
            Path(out) / "discriminator", task="classifier", tokenizer=str(Path(out) / "policy")
        )
    if recipe and branches:
        warm_starts(dataset, Path(out), recipe, overrides, branches)


def warm_starts(dataset: str, out: Path, recipe: str, overrides: str, branches: list) -> None:
    """One behaviour-cloning warm start per issue, cloned here on every core, in
    ``out/warm_starts/ISSUE/sft``: the branches of the embedded default run side by side, a
    core each, and each cloned the same model from the same rows before (the demo's GRPO and
    GRAIL recipes clone alike). It follows the issue's first branch whose recipe clones; a
    branch adopts it only where its own settings, examples and start model are the same
    (``sft_reuse``), and clones anew otherwise."""
    from grail.train.config import parse_train_args
    from grail.train.sft import sft_warm_start

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    done: set[str] = set()
    for branch in branches:
        issue, algorithm = branch["issue"], branch["algorithm"]
        if issue in done:
            continue
        path = resolve_recipe(recipe, short_name(issue), algorithm)
        values = read_recipe(path) | overrides_values(overrides)
        if not values.get("sft_dataset"):
            continue  # this branch clones nothing (the recipe read alone, not parsed)
        where = out / WARM_STARTS / issue
        args = training_args(path, dataset, issue, algorithm, str(where), "")
        args += tiny_model_args(out, reads_classifier(algorithm, values))
        args += overrides_to_args(overrides)
        config, model_config = parse_train_args(args)
        if not config.sft_dataset or config.sft_reuse:
            continue
        sft_warm_start(config, model_config)
        done.add(issue)


def tiny_model_args(folder: Path, classifier: bool) -> list[str]:
    """The tiny policy (and the tiny classifier as GRAIL's discriminator, where the branch
    reads one) of a :func:`tiny_models_task` folder."""
    args = ["--model_name_or_path", str(folder / "policy")]
    return args + (["--gail_model", str(folder / "discriminator")] if classifier else [])


def reads_classifier(algorithm: str, values: dict) -> bool:
    """Whether a branch (its recipe's values with the run's overrides) reads a classifier as
    its discriminator: GRAIL with ``gail_discriminator: classifier``, the default.

    >>> reads_classifier("grail", {}), reads_classifier("grail", {"gail_discriminator": "features"})
    (True, False)
    >>> reads_classifier("grpo", {})
    False
    """
    return algorithm == "grail" and values.get("gail_discriminator", "classifier") == "classifier"


def classifier_wanted(recipe: str, overrides: str, branches: list | None) -> bool:
    """Whether any branch reads the tiny classifier (every branch may, without a recipe and
    branches to read)."""
    if not (recipe and branches):
        return True
    extra = overrides_values(overrides)
    return any(
        reads_classifier(b["algorithm"], read_recipe(
            resolve_recipe(recipe, short_name(b["issue"]), b["algorithm"])) | extra)
        for b in branches
    )  # fmt: skip


def checkpoint_location(uri: str, key: str, algorithm: str, issue: str) -> str:
    """Where one run's checkpoints of one algorithm and issue live.

    >>> checkpoint_location("s3://b/ckpt/", "run-1", "grail", "gun_control")
    's3://b/ckpt/run-1/grail/gun_control'
    """
    return run_folder(uri, key, "checkpoint key", algorithm, issue)


def log_datasets(run_id: str, dataset: Path, issue: str) -> None:
    """The branch's train and validation rows as the run's MLflow dataset inputs (the task's
    ``tracked_rows``: the slate task's rows of the issue, the summarize task's documents)."""
    import warnings

    import mlflow

    with mlflow.start_run(run_id=run_id), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MLflow's schema hints about integer columns
        for split, context in (("train", "training"), ("validation", "validation")):
            path = dataset / f"{split}.parquet"
            if not path.is_file():
                continue
            rows, targets = TASKS[recorded_task(dataset)].tracked_rows(path, issue)
            log_input(
                mlflow.data.from_pandas(
                    rows, source=str(path), name=f"{issue}/{split}", targets=targets
                ),
                context,
            )


def log_input(dataset, context: str, pause: float = 1.0) -> None:
    """``mlflow.log_input`` into the active run, tried once more after the tracking server's
    BAD_REQUEST. The server looks a dataset up and inserts it in two statements (mlflow 3.17,
    ``SqlAlchemyStore._log_inputs_impl``), so two branches' train tasks that log the same
    issue's rows at once can both insert it, and one fails on the dataset's unique key (seen in
    CI). Its transaction is rolled back; the second try finds the row and links it."""
    import time

    import mlflow
    from mlflow.exceptions import RestException

    try:
        mlflow.log_input(dataset, context=context)
    except RestException as error:
        if error.error_code != "BAD_REQUEST":
            raise
        time.sleep(pause)
        mlflow.log_input(dataset, context=context)


def run_tiny_models(
    *, dataset, tiny_model: bool, models, task: str, recipe: str = "", overrides: str = "{}",
    branches: list | None = None,
) -> None:  # fmt: skip
    """The tiny-models component's body: :func:`tiny_models_task` into the `models` artifact."""
    tiny_models_task(dataset.path, tiny_model, models.path, task, recipe, overrides, branches)


def run_train(
    *,
    dataset,
    base_models,
    recipe: str,
    overrides: str,
    issue: str,
    algorithm: str,
    tiny_model: bool,
    checkpoint_uri: str,
    checkpoint_key: str,
    kfp_run_id: str,
    parent_run: str,
    model,
    metrics,
    generated=None,
    backend: str = "pod",
    nodes: int = 1,
    train_image: str = "",
    gpu_type: str = "nvidia.com/gpu",
    gpu_count: str = "1",
    node_selector: dict | None = None,
    tolerations: list | None = None,
    cpu: str = "8",
    memory: str = "64Gi",
    s3_secret: str = "",
    mlflow_secret: str = "",
) -> None:
    """The train component's body: :func:`train_task` into the `model` artifact (its
    metadata names the branch), the final metrics into `metrics`. With `generated` (a
    generate output) an SFT warm start first. With backend "trainjob" the same training runs
    as a Kubeflow Trainer TrainJob of `nodes` x `gpu_count` GPUs on the pool the other
    settings describe (:func:`grail.components.train.trainjob.runner_for`)."""
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
            node_selector=node_selector or {},
            tolerations=tolerations or [],
        )
        runner = runner_for(
            backend,
            pool,
            model.path,
            (kfp_run_id, issue, algorithm),
            tiny_model or generated is not None,  # models only this pod has
            {"s3": s3_secret, "mlflow": mlflow_secret},
        )
    final = train_task(
        dataset=dataset.path,
        recipe=recipe,
        overrides=overrides,
        issue=issue,
        algorithm=algorithm,
        base_models=base_models.path if tiny_model else "",
        checkpoint_uri=checkpoint_uri,
        checkpoint_key=checkpoint_key or kfp_run_id,
        parent=parent_run,
        out=model.path,
        runner=runner,
    )
    for name, value in final.items():
        metrics.log_metric(name, value)
    model.metadata.update({"issue": issue, "algorithm": algorithm})
