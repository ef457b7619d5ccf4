"""The summarize task's DAG: clean (RepLiQA or a synthetic document study) -> [generate: a
teacher's summaries] -> train (per algorithm) -> benchmark -> export, the slate DAG's
components with ``task="summarize"``.

Compile with ``grail compile`` (writes ``pipelines/summarize.yaml`` beside ``grail.yaml``); run
locally with ``grail run --local --task summarize``; on a cluster with ``kfp run create -e EXP
-f pipelines/summarize.yaml`` or ``grail submit pipelines/summarize.yaml``. docs/pipeline.md
says why this is a second pipeline and not a switch of the first.
"""

from grail.pipelines.pipeline import tracked_run
from kfp import dsl

from grail.core.images import IMAGE, TRAIN_IMAGE

TASK = "summarize"


@dsl.pipeline(
    name="grail-summarize",
    description="Train and benchmark LLM document summarizers with GRPO, rewarded by how "
    "many hidden questions a reader answers from the summary (Summary-RL on RepLiQA).",
)
def summarize_pipeline(
    raw_uri: str = "",
    documents: int = 0,
    seed: int = 80,
    validation_documents: int = 91,
    recipe: str = "recipes/Qwen2.5-3B-Instruct/summarize/config_{algorithm}.yaml",
    recipe_overrides: str = "{}",
    algorithms: list = ["grpo"],  # noqa: B006 (a KFP default value)
    tiny_model: bool = False,
    generate_data: bool = False,
    generate_model: str = "",
    num_generations: int = 4,
    generate_limit: int = 0,
    generate_prompt: str = '{"summary_mode": "abstractive", "summary_budget": 3000, '
    '"max_new_tokens": 1000}',
    reference_models: str = "[]",
    benchmark_limit: int = 0,
    benchmark_max_new_tokens: int = 0,
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
    benchmark_cpu: str = "4",
    benchmark_memory: str = "16Gi",
    light_cpu: str = "500m",
    light_memory: str = "1Gi",
    generate_cpu: str = "2",
    generate_memory: str = "4Gi",
    mlflow_experiment: str = "grail-summarize",
    s3_secret: str = "grail-s3",
    mlflow_secret: str = "grail-mlflow",
    openai_secret: str = "grail-openai",
):
    """Train and benchmark LLM document summarizers with GRPO (OpenPipe's Summary-RL).

    Args:
        raw_uri: RepLiQA: hf:ServiceNow/repliqa (through datasets, split repliqa_0), or
            s3://, file:// or a path holding .jsonl/.parquet files in its layout. Empty
            simulates a document study of `documents` with known facts.
        documents: Size of the simulated study when raw_uri is empty (0 = 300).
        seed: Seed of the simulated study and of the document split (Summary-RL's 80).
        validation_documents: Documents held out for validation (Summary-RL's 91).
        recipe: Training recipe path; {algorithm} is filled in per branch (its task must be
            summarize; it names the reader and judge for RepLiQA).
        recipe_overrides: JSON object of recipe fields to override, e.g. {"max_steps": 10}.
        algorithms: The algorithms to train, one parallel branch each: grpo (GAIL and
            behaviour cloning are the slate task's).
        tiny_model: Train an offline tiny summarizer built from the documents (the laptop demo).
        generate_data: Ask a teacher (generate_model) for summaries of the training documents
            first, and warm-start by SFT on each document's best (ART's sft-rl recipe).
        generate_model: The teacher: openai:NAME@URL (vllm serve) or openai:NAME (an API
            model, its key from openai_secret), when generate_data is on.
        num_generations: Teacher summaries per document (the best-answering one is kept).
        generate_limit: Training documents the teacher summarizes (0 = all).
        generate_prompt: JSON of how the teacher is asked; keep it equal to the recipe's
            summary_mode, summary_budget and max_completion_length (max_new_tokens).
        reference_models: JSON list of models to benchmark beside it through the same prompt
            and reader (openai:gpt-4o, openai:NAME@URL).
        benchmark_limit: Validation documents benchmarked (0 = all).
        benchmark_max_new_tokens: Reply length in the benchmark; 0 asks each model as it was
            trained (its max_completion_length).
        train_backend: pod trains in the train task's pod (one node, gpu_count GPUs);
            trainjob as a Kubeflow Trainer TrainJob of train_nodes nodes x gpu_count GPUs.
        train_nodes: Nodes of the TrainJob (train_backend trainjob).
        checkpoint_uri: Where checkpoints go after every save (s3://bucket/prefix; empty = none).
        checkpoint_key: Empty keys checkpoints by this run's id (a retried pod resumes its own);
            a name resumes that named run on purpose (checkpoint_uri/KEY/ALGORITHM/summarize).
        export_destination: Where the final model, benchmark and manifest are exported, under
            RUN/ALGORITHM/summarize so no run replaces another's.
        promote_if: The promotion gate's rule: beats_prior (a summarizer whose share answered
            beats the best baseline by its 95% interval gets the registered model's champion
            alias), always or never. Every model is exported; one not promoted is marked
            promoted: false with the reason.
        run_name: The RUN folder of the exports; empty = the KFP run id.
        image: The CPU image (clean, export, tracking).
        train_image: The CUDA training image (training and the benchmark of its checkpoints).
        gpu_type: Accelerator resource name of the GPU pool (nvidia.com/gpu).
        gpu_count: GPUs per training pod, as a string (the 2.17 driver reads it as one).
        node_selector: JSON node labels of the GPU pool.
        tolerations: JSON list of tolerations for the GPU pool's taints.
        benchmark_gpu_type: Accelerator resource name of the benchmark's pool.
        benchmark_gpu_count: GPUs per benchmark pod, as a string.
        benchmark_node_selector: JSON node labels of the benchmark's pool.
        benchmark_tolerations: JSON list of tolerations for the benchmark pool's taints.
        train_cpu: CPU request of the training pod.
        train_memory: Memory request and limit of the training pod.
        clean_cpu: CPU request of the clean and tiny-model tasks.
        clean_memory: Memory request and limit of the clean and tiny-model tasks.
        benchmark_cpu: CPU request of the benchmark task.
        benchmark_memory: Memory request and limit of the benchmark task.
        light_cpu: CPU request of the tracking and export tasks.
        light_memory: Memory request and limit of the tracking and export tasks.
        generate_cpu: CPU request of the generate task.
        generate_memory: Memory request and limit of the generate task.
        mlflow_experiment: The MLflow experiment the runs go to.
        s3_secret: Name of the Kubernetes secret with the object-store credentials.
        mlflow_secret: Name of the Kubernetes secret with the MLflow URI and credentials.
        openai_secret: Name of the Kubernetes secret with OPENAI_API_KEY (an API reader, judge
            or reference model; optional).
    """
    params = dict(locals())  # the parameters, as pipeline channels
    clean_inputs = dict(
        raw_uri=raw_uri,
        participants=0,
        seed=seed,
        validation_fraction=0.0,
        documents=documents,
        validation_documents=validation_documents,
    )
    # no issues: the branches train on documents
    tracked_run(TASK, params, [], clean_inputs, generate_data)
