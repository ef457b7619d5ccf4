"""The grail DAG: clean -> [generate] -> train (per issue x algorithm) -> benchmark -> export,
then one comparison of the algorithms per issue.

Compile with ``grail compile`` (writes ``pipelines/grail.yaml``); run locally with
``grail run --local``; on a cluster with ``kfp run create -e EXP -f pipelines/grail.yaml`` or
``grail submit``. Every parameter below can be changed when rerunning from the Kubeflow UI.
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

from grail.clean.config import CleanConfig
from grail.core.images import IMAGE, TRAIN_IMAGE
from grail.generate.config import GenerateConfig
from grail.tasks import TASKS
from grail.tasks.slate.policy_issues import ISSUES

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
        if "counterfactual_viewers" in p
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
            dataset=cleaned.outputs["dataset"], tiny_model=p["tiny_model"], task=task
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


@dsl.pipeline(
    name="grail",
    description="Train and benchmark LLM viewers of recommendation "
    "slates with GRPO / GRAIL, from a study's raw export to an exported model.",
)
def grail_pipeline(
    raw_uri: str = "",
    participants: int = 0,
    seed: int = CleanConfig.seed,
    validation_fraction: float = CleanConfig.validation_fraction,
    recipe: str = "recipes/Qwen2.5-1.5B-Instruct/grpo/config_{algorithm}_{issue}.yaml",
    recipe_overrides: str = "{}",
    issues: list = list(ISSUES),  # noqa: B006, B008 (a KFP default value)
    algorithms: list = ["grpo", "grail"],  # noqa: B006 (a KFP default value)
    tiny_model: bool = False,
    generate_data: bool = False,
    generate_model: str = "",
    num_generations: int = GenerateConfig.num_generations,
    generate_limit: int = 0,
    reference_models: str = "[]",
    benchmark_limit: int = 0,
    benchmark_max_new_tokens: int = 0,
    # grail counterfactual's defaults (the DAG's module loads no stage; a test holds them equal)
    counterfactual_viewers: int = 40,
    counterfactual_steps: int = 5,
    counterfactual_recommenders: list = [  # noqa: B006 (a KFP default value)
        "factual",
        "like_minded",
        "cross_cutting",
        "popularity",
        "random",
        "replayed",
    ],
    train_backend: str = "pod",
    train_nodes: int = 1,
    checkpoint_uri: str = "s3://grail/checkpoints",
    checkpoint_key: str = "",
    export_destination: str = "s3://grail/exports",
    promote_if: str = "beats_prior",
    run_name: str = "",
    image: str = IMAGE,
    train_image: str = TRAIN_IMAGE,
    gpu_type: str = "nvidia.com/gpu",
    gpu_count: str = "1",
    node_selector: dict = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},  # noqa: B006
    tolerations: list = [  # noqa: B006
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ],
    benchmark_gpu_type: str = "nvidia.com/gpu",
    benchmark_gpu_count: str = "1",
    benchmark_node_selector: dict = {  # noqa: B006
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb"
    },
    benchmark_tolerations: list = [  # noqa: B006
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ],
    train_cpu: str = "8",
    train_memory: str = "64Gi",
    clean_cpu: str = "2",
    clean_memory: str = "8Gi",
    generate_cpu: str = "2",
    generate_memory: str = "4Gi",
    benchmark_cpu: str = "4",
    benchmark_memory: str = "16Gi",
    light_cpu: str = "500m",
    light_memory: str = "1Gi",
    mlflow_experiment: str = "grail",
    s3_secret: str = "grail-s3",
    mlflow_secret: str = "grail-mlflow",
    openai_secret: str = "grail-openai",
):
    """Train and benchmark LLM viewers of recommendation slates with GRPO or GRAIL.

    Args:
        raw_uri: The study's raw export (s3:// or file://; the CodeOcean capsule or grail's
            layout). Empty simulates a study of `participants` people.
        participants: Size of the simulated study when raw_uri is empty (0 = the real size).
        seed: Seed of the simulated study and of the participant split.
        validation_fraction: Share of participants in the validation split.
        recipe: Training recipe path; {algorithm} (grpo, grail or bc) and {issue} (gun or wage)
            are filled in per branch.
        recipe_overrides: JSON object of recipe fields to override, e.g. {"max_steps": 10}.
        issues: The issues to train (gun_control, minimum_wage).
        algorithms: The algorithms to train on each issue, one parallel branch per issue and
            algorithm, compared per issue: grpo, grail (GRPO plus the GAIL discriminator reward),
            bc (behaviour cloning: SFT on the train split's own choices, no RL).
        tiny_model: Train offline tiny models built from the data (the laptop demo).
        generate_data: Generate completions with generate_model first and warm-start by SFT.
        generate_model: The generation model spec (openai:NAME@URL) when generate_data is on.
        num_generations: Completions per prompt when generating.
        generate_limit: Prompts to generate for (0 = all).
        reference_models: JSON list of extra benchmark model specs (openai:gpt-4o,
            openai:NAME@URL).
        benchmark_limit: Validation rows benchmarked per issue (0 = all).
        benchmark_max_new_tokens: Answer length in the benchmark; 0 asks each model as it was
            trained (its max_completion_length).
        counterfactual_viewers: Validation participants per issue whose sessions every
            trained model, baseline and the truth roll out under each recommender
            (docs/counterfactual.md); 0 skips the counterfactual task. A real study (no
            truth) runs the replayed arm against people's sessions alone.
        counterfactual_steps: Clicks per counterfactual session.
        counterfactual_recommenders: The recommenders rolled out (factual, like_minded,
            cross_cutting, popularity, random, replayed).
        train_backend: pod trains in the train task's pod (one node, gpu_count GPUs);
            trainjob runs the same training as a Kubeflow Trainer TrainJob of train_nodes
            nodes x gpu_count GPUs (the torch-distributed runtime of Trainer v2.3), with the
            train task as its launcher on a light pod.
        train_nodes: Nodes of the TrainJob (train_backend trainjob).
        checkpoint_uri: Where checkpoints go after every save (s3://bucket/prefix; empty = none).
        checkpoint_key: Empty keys checkpoints by this run's id (a retried pod resumes its own);
            a name resumes that named run on purpose (checkpoint_uri/KEY/ALGORITHM/ISSUE).
        export_destination: Where the final model, benchmark and manifest are exported, under
            RUN/ALGORITHM/ISSUE so no run replaces another's.
        promote_if: The promotion gate's rule: beats_prior (a model whose held-out log-loss
            minus always-first's has a paired 95% interval below 0, and no collapse, gets the
            registered model's champion alias), always or never. Every model is exported;
            one not promoted is marked promoted: false with the reason.
        run_name: The RUN folder of the exports; empty = the KFP run id.
        image: The CPU image (clean, export, tracking).
        train_image: The CUDA training image (training and the benchmark of its checkpoints).
        gpu_type: Accelerator resource name of the GPU pool (nvidia.com/gpu).
        gpu_count: GPUs per training pod, as a string (the 2.17 driver reads it as one).
        node_selector: JSON node labels of the GPU pool.
        tolerations: JSON list of tolerations for the GPU pool's taints.
        benchmark_gpu_type: Accelerator resource name of the benchmark's pool (by default the
            training pool's).
        benchmark_gpu_count: GPUs per benchmark pod, as a string.
        benchmark_node_selector: JSON node labels of the benchmark's pool (an inference pool).
        benchmark_tolerations: JSON list of tolerations for the benchmark pool's taints.
        train_cpu: CPU request of the training pod.
        train_memory: Memory request and limit of the training pod.
        clean_cpu: CPU request of the clean task.
        clean_memory: Memory request and limit of the clean task.
        generate_cpu: CPU request of the generate task.
        generate_memory: Memory request and limit of the generate task.
        benchmark_cpu: CPU request of the benchmark task.
        benchmark_memory: Memory request and limit of the benchmark task.
        light_cpu: CPU request of the tracking and export tasks.
        light_memory: Memory request and limit of the tracking and export tasks.
        mlflow_experiment: The MLflow experiment the runs go to.
        s3_secret: Name of the Kubernetes secret with the object-store credentials.
        mlflow_secret: Name of the Kubernetes secret with the MLflow URI and credentials.
        openai_secret: Name of the Kubernetes secret with OPENAI_API_KEY (optional).
    """
    params = dict(locals())  # the parameters, as pipeline channels
    clean_inputs = dict(
        raw_uri=raw_uri,
        participants=participants,
        seed=seed,
        validation_fraction=validation_fraction,
    )
    tracked_run("slate", params, issues, clean_inputs, generate_data)
