"""The summarize task's DAG (``pipelines/summarize.yaml``): clean (RepLiQA or a synthetic
document study) -> [generate: a teacher's summaries] -> train -> benchmark -> export, built by
``grail.pipelines.dag`` from the shared parameters and these. docs/pipeline.md says why this
is a DAG of its own and not a switch of the slate one."""

from __future__ import annotations

from grail.tasks import Dag, Parameter


def clean_inputs(params: dict) -> dict:
    """The clean component's study inputs: documents and the document split (no issues)."""
    return {
        "raw_uri": params["raw_uri"],
        "participants": 0,
        "seed": params["seed"],
        "validation_fraction": 0.0,
        "documents": params["documents"],
        "validation_documents": params["validation_documents"],
    }


DAG = Dag(
    name="grail-summarize",
    file="summarize.yaml",
    description="Train and benchmark LLM document summarizers with GRPO, rewarded by how "
    "many hidden questions a reader answers from the summary (Summary-RL on RepLiQA).",
    parameters=(
        Parameter(
            "documents", int, 0, "Size of the simulated study when raw_uri is empty (0 = 300)."
        ),
        Parameter(
            "validation_documents",
            int,
            91,
            "Documents held out for validation (Summary-RL's 91).",
        ),
        Parameter(
            "generate_prompt",
            str,
            '{"summary_mode": "abstractive", "summary_budget": 3000, "max_new_tokens": 1000}',
            "JSON of how the teacher is asked; keep it equal to the recipe's summary_mode, "
            "summary_budget and max_completion_length (max_new_tokens).",
        ),
    ),
    defaults={
        "raw_uri": (
            "",
            "RepLiQA: hf:ServiceNow/repliqa (through datasets, split repliqa_0), or s3://, "
            "file:// or a path holding .jsonl/.parquet files in its layout. Empty simulates a "
            "document study of `documents` with known facts.",
        ),
        "seed": (80, "Seed of the simulated study and of the document split (Summary-RL's 80)."),
        "recipe": (
            "recipes/Qwen2.5-3B-Instruct/summarize/config_{algorithm}.yaml",
            "Training recipe path; {algorithm} is filled in per branch (its task must be "
            "summarize; it names the reader and judge for RepLiQA).",
        ),
        "algorithms": (
            ["grpo"],
            "The algorithms to train, one parallel branch each: grpo (GAIL and behaviour "
            "cloning are the slate task's).",
        ),
        "generate_data": (
            False,
            "Ask a teacher (generate_model) for summaries of the training documents first, "
            "and warm-start by SFT on each document's best (ART's sft-rl recipe).",
        ),
        "promote_if": (
            "beats_prior",
            "The promotion gate's rule: beats_prior (a summarizer whose share answered beats "
            "the best baseline by its 95% interval gets the registered model's champion "
            "alias), always or never. Every model is exported; one not promoted is marked "
            "promoted: false with the reason.",
        ),
        "mlflow_experiment": ("grail-summarize", "The MLflow experiment the runs go to."),
    },
    clean_inputs=clean_inputs,
)
