"""Every task's DAG body: clean -> [generate] -> train (per subject x algorithm) -> benchmark
-> export, then one comparison of the algorithms per subject where the task compares them;
:mod:`grail.pipelines.dag` wraps it in each task's parameters.

Compile with ``grail compile`` (writes ``pipelines/grail.yaml``, ``pipelines/summarize.yaml``);
run locally with ``grail run --local``; on a cluster with ``kfp run create -e EXP -f
pipelines/grail.yaml`` or ``grail submit``. Every parameter can be changed when rerunning from
the Kubeflow UI.
"""

from dataclasses import dataclass
from typing import Any

from grail.components.benchmark.component import benchmark
from grail.components.clean.component import clean
from grail.components.compare.component import compare
from grail.components.counterfactual.component import counterfactual
from grail.components.export.component import export
from grail.components.generate.component import generate
from grail.components.promote.component import promote
from grail.components.secrets import MLFLOW_KEYS, OPENAI_KEYS, S3_KEYS
from grail.components.tracking.component import finish_tracking, start_tracking
from grail.components.train.component import tiny_models, train
from kfp import dsl, kubernetes

from grail.tasks import TASKS

# The uid of our images' user: every task runs as it (kfp.local ignores platform settings).
IMAGE_USER = 10001


def with_secrets(task, s3_secret, mlflow_secret, openai_secret=None):
    """Object-store and MLflow credentials (and the OpenAI key) from Kubernetes secrets.

    The secrets are optional so that a run without (say) an OpenAI key still starts;
    `grail doctor` checks the ones the chosen install mode needs are there.
    """
    kubernetes.use_secret_as_env(
        task, secret_name=s3_secret, secret_key_to_env=S3_KEYS, optional=True
    )
    kubernetes.use_secret_as_env(
        task, secret_name=mlflow_secret, secret_key_to_env=MLFLOW_KEYS, optional=True
    )
    if openai_secret is not None:
        kubernetes.use_secret_as_env(
            task, secret_name=openai_secret, secret_key_to_env=OPENAI_KEYS, optional=True
        )
    return task


def on_pod(task, name: str, image, cpu, memory):
    """Display name, image, resources and a non-root security context for one task.

    `cpu` and `memory` are pipeline parameters, strings as KFP's driver reads them; inside a
    ParallelFor their channels are registered here, as the SDK does not (docs/pins.md#kfp-217).
    """
    task.set_display_name(name).set_container_image(image)
    task.set_cpu_request(cpu).set_memory_request(memory).set_memory_limit(memory)
    task.register_pipeline_channels([cpu, memory])
    kubernetes.set_security_context(
        task, run_as_user=IMAGE_USER, run_as_group=IMAGE_USER, run_as_non_root=True
    )
    return task


def on_gpu_pool(task, pool, prefix: str = ""):
    """A GPU task on the node pool chosen per run (training's, or with `prefix` "benchmark_"
    the benchmark's own), with shared memory for NCCL."""
    gpu_type, gpu_count = pool[f"{prefix}gpu_type"], pool[f"{prefix}gpu_count"]
    task.set_accelerator_type(gpu_type).set_accelerator_limit(gpu_count)
    task.register_pipeline_channels([gpu_type, gpu_count])
    kubernetes.add_node_selector_json(task, pool[f"{prefix}node_selector"])
    kubernetes.add_toleration_json(task, pool[f"{prefix}tolerations"])
    kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    return task


# The run's parameters that place tasks: images, pools, requests.
POOL = (
    "image",
    "train_image",
    "gpu_type",
    "gpu_count",
    "node_selector",
    "tolerations",
    "benchmark_gpu_type",
    "benchmark_gpu_count",
    "benchmark_node_selector",
    "benchmark_tolerations",
    "train_cpu",
    "train_memory",
    "benchmark_cpu",
    "benchmark_memory",
    "light_cpu",
    "light_memory",
)


@dataclass(frozen=True)
class Settings:
    """What every branch of a run reads: the task, the branches (issue x algorithm), the
    cleaned dataset and tiny models, and the run's settings (pipeline channels)."""

    task: str
    branches: Any
    dataset: Any
    base_models: Any
    recipe: Any
    overrides: Any
    tiny_model: Any
    checkpoint_uri: Any
    checkpoint_key: Any
    train_backend: Any
    train_nodes: Any
    reference_models: Any
    benchmark_limit: Any
    benchmark_reads_rows: Any
    benchmark_max_new_tokens: Any
    export_destination: Any
    promote_if: Any
    run_name: Any
    parent_run: Any
    counterfactual: dict | None = None  # viewers, steps, recommenders (the slate task's)


def trained_where(task, on_trainjob: bool, pool):
    """The train task's pod: the GPU pool (training in the pod), or a light CPU pod that runs
    the training as a TrainJob of `train_nodes` x `gpu_count` GPUs on that pool."""
    if not on_trainjob:
        on_pod(task, "train", pool["train_image"], pool["train_cpu"], pool["train_memory"])
        return on_gpu_pool(task, pool)
    return on_pod(task, "train (TrainJob)", pool["image"], pool["light_cpu"], pool["light_memory"])


def branch_tasks(branch, generated, settings, secrets, pool, on_trainjob: bool):
    """One branch's train -> benchmark -> promote (the promotion gate) -> export (and, with
    counterfactual viewers, its counterfactual sessions); returns the benchmark task."""
    dataset, base_models = settings.dataset, settings.base_models
    # a task whose training may ask an API model (the summarize task's reader) gets its key
    reader_key = secrets if TASKS[settings.task].trains_with_api else {}
    trained = train(
        dataset=dataset,
        base_models=base_models,
        recipe=settings.recipe,
        overrides=settings.overrides,
        issue=branch.issue,
        algorithm=branch.algorithm,
        tiny_model=settings.tiny_model,
        checkpoint_uri=settings.checkpoint_uri,
        checkpoint_key=settings.checkpoint_key,
        kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        parent_run=settings.parent_run,
        backend="trainjob" if on_trainjob else settings.train_backend,
        nodes=settings.train_nodes,
        train_image=pool["train_image"],
        gpu_type=pool["gpu_type"],
        gpu_count=pool["gpu_count"],
        node_selector=pool["node_selector"],
        tolerations=pool["tolerations"],
        cpu=pool["train_cpu"],
        memory=pool["train_memory"],
        s3_secret=secrets["s3_secret"],
        mlflow_secret=secrets["mlflow_secret"],
        **({"generated": generated} if generated is not None else {}),
    )
    trained_where(trained, on_trainjob, pool).set_caching_options(False)
    trained.set_retry(num_retries=2, backoff_duration="60s", backoff_factor=2.0)
    with_secrets(
        trained, secrets["s3_secret"], secrets["mlflow_secret"], reader_key.get("openai_secret")
    )
    scored = benchmark(
        dataset=dataset,
        model=trained.outputs["model"],
        base_models=base_models,
        tiny_model=settings.tiny_model,
        issue=branch.issue,
        algorithm=branch.algorithm,
        reference_models=settings.reference_models,
        limit=settings.benchmark_limit,
        reads_rows=settings.benchmark_reads_rows,
        max_new_tokens=settings.benchmark_max_new_tokens,
        parent_run=settings.parent_run,
        task=settings.task,
    )
    # Checkpoints are scored with the training image (vLLM) on a GPU pool of their own
    # (benchmark_*: by default the training pool's values); the benchmark picks vLLM there
    # and transformers on a CPU-only machine.
    on_pod(
        scored,
        "benchmark",
        pool["train_image"],
        pool["benchmark_cpu"],
        pool["benchmark_memory"],
    )
    on_gpu_pool(scored, pool, "benchmark_").set_caching_options(False)
    with_secrets(scored, **secrets)
    gated_export(branch, trained, scored, settings, secrets, pool)
    if settings.counterfactual is not None:
        counterfactual_sessions(branch, trained, scored, settings, secrets, pool)
    return scored


def gated_export(branch, trained, scored, settings, secrets, pool):
    """The branch's promotion gate on its benchmark (a task whose output is its decision),
    then its export, which records the decision and registers the model (the champion alias
    only on a promoted one)."""
    gate = promote(
        results=scored.outputs["results"],
        promote_if=settings.promote_if,
        issue=branch.issue,
        algorithm=branch.algorithm,
        parent_run=settings.parent_run,
    )
    on_pod(gate, "promote", pool["image"], pool["light_cpu"], pool["light_memory"])
    gate.set_caching_options(False)
    with_secrets(gate, secrets["s3_secret"], secrets["mlflow_secret"])
    exported = export(
        model=trained.outputs["model"],
        results=scored.outputs["results"],
        destination=settings.export_destination,
        run_name=settings.run_name,
        kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        issue=branch.issue,
        algorithm=branch.algorithm,
        parent_run=settings.parent_run,
        decision=gate.outputs["decision"],
    )
    on_pod(exported, "export", pool["image"], pool["light_cpu"], pool["light_memory"])
    exported.set_caching_options(False)
    with_secrets(exported, secrets["s3_secret"], secrets["mlflow_secret"])


def per_branch(generated, settings, secrets, pool, on_trainjob: bool = False):
    """Train -> benchmark -> export for each issue and algorithm (in parallel on a cluster),
    then the algorithms compared per issue, where the task compares them (its ``compare``
    part; the slate task's: paired on the same rows)."""
    with dsl.ParallelFor(settings.branches, name="per-branch") as branch:
        scored = branch_tasks(branch, generated, settings, secrets, pool, on_trainjob)
    if TASKS[settings.task].compare is None:  # the task has no comparison of algorithms
        return
    compared = compare(
        results=dsl.Collected(scored.outputs["results"]), parent_run=settings.parent_run
    )
    on_pod(compared, "compare", pool["image"], pool["light_cpu"], pool["light_memory"])
    compared.set_caching_options(False)
    with_secrets(compared, secrets["s3_secret"], secrets["mlflow_secret"])


def counterfactual_sessions(branch, trained, scored, settings, secrets, pool):
    """After the branch's benchmark (`scored`), its model (and its step 0) drives sessions
    under the recommenders, beside the baselines and the truth (on the benchmark's pool and
    image: the models are asked as the benchmark asks them); skipped with 0 viewers."""
    chosen = settings.counterfactual
    with dsl.If(chosen["viewers"] > 0, name="counterfactual"):
        rolled = counterfactual(
            dataset=settings.dataset,
            model=trained.outputs["model"],
            base_models=settings.base_models,
            tiny_model=settings.tiny_model,
            issue=branch.issue,
            algorithm=branch.algorithm,
            recommenders=chosen["recommenders"],
            viewers=chosen["viewers"],
            steps=chosen["steps"],
            seed=chosen["seed"],
            parent_run=settings.parent_run,
        ).after(scored)  # the benchmark's pool, one task of the branch at a time
        on_pod(
            rolled,
            "counterfactual",
            pool["train_image"],
            pool["benchmark_cpu"],
            pool["benchmark_memory"],
        )
        on_gpu_pool(rolled, pool, "benchmark_").set_caching_options(False)
        with_secrets(rolled, secrets["s3_secret"], secrets["mlflow_secret"])


def on_backend(generated, settings, secrets, pool):
    """The branches with training in its pod or as a TrainJob (train_backend), two copies of
    one DAG: kfp.local cannot pick an artifact out of a dsl.OneOf, so the choice wraps the
    whole branch (train, benchmark, export, compare) instead of the train task alone."""
    with dsl.If(settings.train_backend == "trainjob", name="trainjob"):
        per_branch(generated, settings, secrets, pool, on_trainjob=True)
    with dsl.Else(name="pod"):
        per_branch(generated, settings, secrets, pool)


def branch_settings(task: str, p: dict, start, cleaned, tiny) -> Settings:
    """What every branch reads, from the pipeline's parameters `p` and the tasks before the
    branches (the counterfactual sessions' settings where the pipeline has them: the slate
    DAG's)."""
    return Settings(
        task=task,
        branches=start.outputs["branches"],
        dataset=cleaned.outputs["dataset"],
        base_models=tiny.outputs["models"],
        recipe=p["recipe"],
        overrides=p["recipe_overrides"],
        tiny_model=p["tiny_model"],
        checkpoint_uri=p["checkpoint_uri"],
        checkpoint_key=p["checkpoint_key"],
        train_backend=p["train_backend"],
        train_nodes=p["train_nodes"],
        reference_models=p["reference_models"],
        benchmark_limit=p["benchmark_limit"],
        benchmark_reads_rows=p["benchmark_reads_rows"],
        benchmark_max_new_tokens=p["benchmark_max_new_tokens"],
        export_destination=p["export_destination"],
        promote_if=p["promote_if"],
        run_name=p["run_name"],
        parent_run=start.outputs["parent_run"],
        counterfactual={
            "viewers": p["counterfactual_viewers"],
            "steps": p["counterfactual_steps"],
            "recommenders": p["counterfactual_recommenders"],
            "seed": p["seed"],
        }
        if TASKS[task].counterfactual_branch is not None
        else None,
    )


def tracked_run(task: str, params: dict, issues, clean_inputs: dict, generate_data=None):
    """The DAG of either task (its pipeline's signature spells the parameters out, as KFP
    needs): tracking around clean -> tiny models -> [generate] -> the branches. `params`: the
    pipeline's parameters (channels); `issues`: the branches' issues; `clean_inputs`: the
    clean component's task-specific inputs; `generate_data`: the generate switch, for a task
    whose training can warm-start from generated completions (None: it cannot)."""
    p = params
    image, light = p["image"], (p["light_cpu"], p["light_memory"])
    secrets = dict(
        s3_secret=p["s3_secret"], mlflow_secret=p["mlflow_secret"], openai_secret=p["openai_secret"]
    )
    finish = finish_tracking(
        experiment=p["mlflow_experiment"], kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER
    )
    on_pod(finish, "finish-tracking", image, *light)
    with_secrets(finish, p["s3_secret"], p["mlflow_secret"])
    with dsl.ExitHandler(finish, name="tracked-run"):
        start = start_tracking(
            experiment=p["mlflow_experiment"],
            recipe=p["recipe"],
            recipe_overrides=p["recipe_overrides"],
            issues=issues,
            algorithms=p["algorithms"],
            tiny_model=p["tiny_model"],
            kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            image=p["train_image"],
            checkpoint_uri=p["checkpoint_uri"],
            checkpoint_key=p["checkpoint_key"],
            export_destination=p["export_destination"],
            run_name=p["run_name"],
            task=task,
        )
        on_pod(start, "start-tracking", image, *light)
        with_secrets(start, p["s3_secret"], p["mlflow_secret"])
        cleaned = clean(parent_run=start.outputs["parent_run"], task=task, **clean_inputs)
        on_pod(cleaned, "clean", image, p["clean_cpu"], p["clean_memory"])
        with_secrets(cleaned, p["s3_secret"], p["mlflow_secret"])
        tiny = tiny_models(
            dataset=cleaned.outputs["dataset"],
            tiny_model=p["tiny_model"],
            task=task,
            recipe=p["recipe"],
            overrides=p["recipe_overrides"],
            branches=start.outputs["branches"],
        )
        on_pod(tiny, "tiny-models", image, p["clean_cpu"], p["clean_memory"])
        settings = branch_settings(task, p, start, cleaned, tiny)
        pool = {name: p[name] for name in POOL}
        if generate_data is None:
            on_backend(None, settings, secrets, pool)
            return
        with dsl.If(generate_data == True, name="generate"):  # noqa: E712 (a KFP condition)
            generated = generate(
                dataset=cleaned.outputs["dataset"],
                model=p["generate_model"],
                num_generations=p["num_generations"],
                limit=p["generate_limit"],
                parent_run=start.outputs["parent_run"],
                prompt=p.get("generate_prompt", "{}"),
            )
            on_pod(generated, "generate", image, p["generate_cpu"], p["generate_memory"])
            with_secrets(generated, p["s3_secret"], p["mlflow_secret"], p["openai_secret"])
            on_backend(generated.outputs["generated"], settings, secrets, pool)
        with dsl.Else(name="no-generate"):
            on_backend(None, settings, secrets, pool)
