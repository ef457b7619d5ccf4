"""Every task's DAG from its registry entry: the parameters all tasks share (recipe,
algorithms, the generate switch, benchmark, checkpoints, export, pools, secrets), spelled once
here, and the task's own (its ``dag`` part, a :class:`grail.tasks.Dag`), around one
:func:`grail.pipelines.pipeline.tracked_run`.

KFP reads a pipeline's parameters from its function's signature (``inspect.signature``) and
their lines from its docstring's ``Args:``; :func:`pipeline` builds both from the lists, so
adding a task adds no signature here (docs/tasks.md). Compile with ``grail compile``; run with
``grail run --local --task TASK`` or ``kfp run create -e EXP -f pipelines/FILE``.
"""

from __future__ import annotations

import inspect
from functools import cache

from grail.pipelines.pipeline import tracked_run
from kfp import dsl

from grail.clean.config import CleanConfig
from grail.core.images import IMAGE, TRAIN_IMAGE
from grail.generate.config import GenerateConfig
from grail.tasks import TASKS, Parameter

H100 = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
GPU_TAINT = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]

# The parameters before the branches, every task's (a task's `defaults` may change a default
# or a line: its recipe and algorithms, say).
STUDY = (
    Parameter(
        "raw_uri",
        str,
        "",
        "The study's raw export (s3://, file:// or a path; the task says which layouts). "
        "Empty simulates a study (the task's own size parameter).",
    ),
)
SHARED = (
    Parameter("seed", int, CleanConfig.seed, "Seed of the simulated study and of the split."),
    Parameter(
        "recipe",
        str,
        "",
        "Training recipe path; {algorithm} and {issue} (the subject's short name) are filled "
        "in per branch.",
    ),
    Parameter(
        "recipe_overrides",
        str,
        "{}",
        'JSON object of recipe fields to override, e.g. {"max_steps": 10}.',
    ),
    Parameter("algorithms", list, ["grpo"], "The algorithms to train, one parallel branch each."),
    Parameter(
        "tiny_model",
        bool,
        False,
        "Train offline tiny models built from the data (the laptop demo).",
    ),
)
GENERATE = (  # a task with a generate stage (its `generation` part)
    Parameter(
        "generate_data",
        bool,
        False,
        "Generate completions with generate_model first and warm-start by SFT.",
    ),
    Parameter(
        "generate_model",
        str,
        "",
        "The generation model spec (openai:NAME@URL, a vLLM server; openai:NAME, an API model "
        "with its key from openai_secret) when generate_data is on.",
    ),
    Parameter(
        "num_generations",
        int,
        GenerateConfig.num_generations,
        "Completions per prompt when generating.",
    ),
    Parameter("generate_limit", int, 0, "Prompts to generate for (0 = all)."),
)
BRANCHES = (
    Parameter(
        "reference_models",
        str,
        "[]",
        "JSON list of extra benchmark model specs, asked through the same prompt "
        "(openai:gpt-4o, openai:NAME@URL).",
    ),
    Parameter("benchmark_limit", int, 0, "Validation rows benchmarked per subject (0 = all)."),
    Parameter(
        "benchmark_reads_rows",
        int,
        200,
        "Task slate: the first N benchmarked rows each model and the ranker answer again with "
        "the viewer's lines, then the options, swapped: whether it reads (0: none).",
    ),
    Parameter(
        "benchmark_max_new_tokens",
        int,
        0,
        "Answer length in the benchmark; 0 asks each model as it was trained (its "
        "max_completion_length).",
    ),
    Parameter(
        "train_backend",
        str,
        "pod",
        "pod trains in the train task's pod (one node, gpu_count GPUs); trainjob runs the same "
        "training as a Kubeflow Trainer TrainJob of train_nodes nodes x gpu_count GPUs (the "
        "torch-distributed runtime of Trainer v2.3), with the train task as its launcher on a "
        "light pod.",
    ),
    Parameter("train_nodes", int, 1, "Nodes of the TrainJob (train_backend trainjob)."),
    Parameter(
        "checkpoint_uri",
        str,
        "s3://grail/checkpoints",
        "Where checkpoints go after every save (s3://bucket/prefix; empty = none).",
    ),
    Parameter(
        "checkpoint_key",
        str,
        "",
        "Empty keys checkpoints by this run's id (a retried pod resumes its own); a name "
        "resumes that named run on purpose (checkpoint_uri/KEY/ALGORITHM/SUBJECT).",
    ),
    Parameter(
        "export_destination",
        str,
        "s3://grail/exports",
        "Where the final model, benchmark and manifest are exported, under "
        "RUN/ALGORITHM/SUBJECT so no run replaces another's.",
    ),
    Parameter(
        "promote_if",
        str,
        "beats_prior",
        "The promotion gate's rule: beats_prior (the task's: a model that beats its reference "
        "by its 95% interval gets the registered model's champion alias), always or never. "
        "Every model is exported; one not promoted is marked promoted: false with the reason.",
    ),
    Parameter("run_name", str, "", "The RUN folder of the exports; empty = the KFP run id."),
    Parameter("image", str, IMAGE, "The CPU image (clean, export, tracking)."),
    Parameter(
        "train_image",
        str,
        TRAIN_IMAGE,
        "The CUDA training image (training and the benchmark of its checkpoints).",
    ),
    Parameter(
        "gpu_type",
        str,
        "nvidia.com/gpu",
        "Accelerator resource name of the GPU pool (nvidia.com/gpu).",
    ),
    Parameter(
        "gpu_count",
        str,
        "1",
        "GPUs per training pod, as a string (the 2.17 driver reads it as one).",
    ),
    Parameter("node_selector", dict, H100, "JSON node labels of the GPU pool."),
    Parameter(
        "tolerations", list, GPU_TAINT, "JSON list of tolerations for the GPU pool's taints."
    ),
    Parameter(
        "benchmark_gpu_type",
        str,
        "nvidia.com/gpu",
        "Accelerator resource name of the benchmark's pool (by default the training pool's).",
    ),
    Parameter("benchmark_gpu_count", str, "1", "GPUs per benchmark pod, as a string."),
    Parameter(
        "benchmark_node_selector",
        dict,
        H100,
        "JSON node labels of the benchmark's pool (an inference pool).",
    ),
    Parameter(
        "benchmark_tolerations",
        list,
        GPU_TAINT,
        "JSON list of tolerations for the benchmark pool's taints.",
    ),
    Parameter("train_cpu", str, "8", "CPU request of the training pod."),
    Parameter("train_memory", str, "64Gi", "Memory request and limit of the training pod."),
    Parameter("clean_cpu", str, "2", "CPU request of the clean and tiny-model tasks."),
    Parameter(
        "clean_memory", str, "8Gi", "Memory request and limit of the clean and tiny-model tasks."
    ),
    Parameter("benchmark_cpu", str, "4", "CPU request of the benchmark task."),
    Parameter("benchmark_memory", str, "16Gi", "Memory request and limit of the benchmark task."),
    Parameter("light_cpu", str, "500m", "CPU request of the tracking and export tasks."),
    Parameter(
        "light_memory", str, "1Gi", "Memory request and limit of the tracking and export tasks."
    ),
    Parameter("mlflow_experiment", str, "grail", "The MLflow experiment the runs go to."),
    Parameter(
        "s3_secret",
        str,
        "grail-s3",
        "Name of the Kubernetes secret with the object-store credentials.",
    ),
    Parameter(
        "mlflow_secret",
        str,
        "grail-mlflow",
        "Name of the Kubernetes secret with the MLflow URI and credentials.",
    ),
    Parameter(
        "openai_secret",
        str,
        "grail-openai",
        "Name of the Kubernetes secret with OPENAI_API_KEY (optional).",
    ),
)
GENERATE_POOL = (
    Parameter("generate_cpu", str, "2", "CPU request of the generate task."),
    Parameter("generate_memory", str, "4Gi", "Memory request and limit of the generate task."),
)


def parameters(task: str) -> tuple[Parameter, ...]:
    """The parameters of `task`'s DAG in order: the study, the task's own, the shared ones
    (the generate switch and pool where the task has a generate stage), each shared default
    and line as the task's ``dag.defaults`` changes it."""
    entry = TASKS[task]
    dag = entry.dag
    generates = entry.generation is not None
    shared = (*SHARED, *(GENERATE if generates else ()), *BRANCHES)
    shared += GENERATE_POOL if generates else ()
    own = {p.name for p in dag.parameters}
    common = (*STUDY, *shared)
    unknown = sorted(set(dag.defaults) - {p.name for p in common})
    clash = sorted(own & {p.name for p in common})
    if unknown or clash:
        raise ValueError(f"task {task}'s DAG: defaults of no shared parameter {unknown}, "
                         f"own parameters that are shared {clash}")  # fmt: skip
    study, *rest = [
        Parameter(p.name, p.type, *dag.defaults[p.name]) if p.name in dag.defaults else p
        for p in common
    ]
    return (study, *dag.parameters, *rest)


def docstring(summary: str, listed: tuple[Parameter, ...]) -> str:
    """A Google-style docstring whose ``Args:`` KFP reads as the parameters' descriptions.

    >>> print(docstring("A DAG.", (Parameter("seed", int, 1, "Seed."),)))
    A DAG.
    <BLANKLINE>
    Args:
        seed: Seed.
    """
    lines = [summary, "", "Args:", *(f"    {p.name}: {p.doc}" for p in listed)]
    return "\n".join(lines)


@cache
def pipeline(task: str):
    """`task`'s DAG, a KFP pipeline (a GraphComponent) built from its registry entry."""
    entry = TASKS[task]
    dag = entry.dag
    listed = parameters(task)
    names = [p.name for p in listed]

    def run(*channels):  # KFP calls it once, with each parameter's channel in order
        params = dict(zip(names, channels, strict=True))
        subjects = params[dag.subjects] if dag.subjects else []
        generate = params["generate_data"] if entry.generation is not None else None
        tracked_run(task, params, subjects, dag.clean_inputs(params), generate)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    run.__signature__ = inspect.Signature(
        [inspect.Parameter(p.name, kind, default=p.default, annotation=p.type) for p in listed]
    )
    run.__name__ = run.__qualname__ = f"{dag.name.replace('-', '_')}_pipeline"
    run.__doc__ = docstring(dag.description, listed)
    return dsl.pipeline(name=dag.name, description=dag.description)(run)
