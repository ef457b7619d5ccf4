"""The benchmark stage's settings (``grail benchmark``, ``grail compare``): every field with
its help and default, read by the one parser and the generated CLI reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grail.core.config import option
from grail.core.errors import GrailError
from grail.tasks import TASKS, Task


@dataclass(kw_only=True)
class BenchmarkConfig:
    """grail benchmark: baselines, ceilings and models on a split; report, charts, metrics.

    Each model is asked the way it was trained (its prompt.json): a prompt option given here
    (or in a recipe) overrides that for every model."""

    data: str = option("Cleaned folder or parquet file.")
    out: str = option("Output folder.")
    models: list[str] = option(
        "Model folder, training output, checkpoint URI (s3://, file://), openai:NAME@URL or "
        "openai:NAME; repeatable.",
        [],
        aliases=["--model"],
        action="extend",
        metavar="SPEC",
    )
    task: Task = option(
        "slate: choices from recommendation slates; summarize: summaries scored by the hidden "
        "questions a reader answers from them.",
        "slate",
    )
    summary_mode: Literal["extractive", "abstractive"] | None = option(
        "Task summarize: keep numbered sentences, or write the summary (default: as the model "
        "was trained, else extractive).",
        None,
    )
    summary_budget: int | None = option(
        "Task summarize: sentences (extractive) or characters (abstractive) a summary may use, "
        "stated in the prompt (default: as the model was trained, else 12 sentences or 1,200 "
        "characters).",
        None,
    )
    reader: str | None = option(
        "Task summarize: the model reader, openai:NAME@URL or openai:NAME, for questions the "
        "deterministic reader cannot score (RepLiQA; default: the trained model's recipe's).",
        None,
    )
    judge: str | None = option(
        "Task summarize: the judge of reader answers that match the gold one neither exactly "
        "nor by token F1 (default: the trained model's recipe's; none: those count as wrong).",
        None,
    )
    reads_rows: int | None = option(
        "Task slate: the first N scored rows each local model and the ranker answer again, "
        "with the viewer's lines, then the options, swapped for another row's: whether it "
        "reads (reads_viewer, reads_options in metrics.json: log-loss swapped minus as "
        "shown). 0 asks nothing again; default: every scored row.",
        None,
    )
    split: str = option("Split to evaluate.", "validation")
    limit: int | None = option("Evaluate the first N rows.", None)
    references: list[str] | None = option(
        "Systems to compute win rates against (default: all); repeatable.",
        None,
        aliases=["--reference"],
        action="extend",
        metavar="NAME",
    )
    truth: str | None = option("truth_steps.csv for the ceiling (default: next to the data).", None)
    max_new_tokens: int | None = option(
        "Tokens per answer (default: the model's max_completion_length, else 128).", None
    )
    batch_size: int = option("Local generation batch size.", 16)
    backend: Literal["auto", "transformers", "vllm"] = option(
        "Local models: vLLM where a GPU and vllm are present (auto), else transformers; vllm "
        "also runs on vLLM's CPU build (make install-vllm).",
        "auto",
    )
    thought_samples: int = option(
        "Local models that think (one greedy reply in 20 or more writes a thought): replies "
        "sampled per row at temperature 1; the choice distribution is the mixture of the "
        "options' probabilities after each sampled thought. 0: the greedy thought's alone.",
        8,
    )
    concurrency: int = option("Parallel API requests.", 8)
    samples: int = option(
        "API models whose server returns no logprobs: answers sampled per row for their choice "
        "distribution.",
        8,
    )
    bootstrap: int = option(
        "Participant-bootstrap replicates behind every interval and paired difference.", 1000
    )
    start_model: str | None = option(
        "The model training started from (a folder or a hub name): scored as step 0 of the "
        "trained series (default: the training output's start.json, when it names a folder).",
        None,
    )
    dry_run: bool = option("Print what API models would be sent; send nothing.", False)

    def __post_init__(self):
        if self.limit is not None and self.limit < 1:
            raise GrailError(f"limit: expected a whole number of at least 1, got {self.limit}")
        for task in TASKS.values():  # each task's own options (the reader and the judge)
            task.check_benchmark(self)
        if self.thought_samples < 0:
            raise GrailError(
                f"thought_samples: expected 0 (greedy) or more, got {self.thought_samples}"
            )
        if self.reads_rows is not None and self.reads_rows < 0:
            raise GrailError(f"reads_rows: expected 0 (none) or more, got {self.reads_rows}")
        for name in ("samples", "bootstrap", "batch_size", "concurrency", "max_new_tokens"):
            at_least_one(self, name)
        if self.summary_budget is not None and self.summary_budget < 1:
            raise GrailError(
                f"summary_budget: expected at least 1 (sentences or characters), got "
                f"{self.summary_budget}"
            )


@dataclass(kw_only=True)
class CompareConfig:
    """grail compare: the algorithms of one run compared per issue (paired on the same rows)."""

    results: list[str] = option(
        "Benchmark output folder, one per issue and algorithm; repeatable.",
        [],
        aliases=["--result"],
        action="extend",
        metavar="FOLDER",
    )
    out: str = option("Output folder (comparison.json, comparison.md).")
    bootstrap: int = option("Participant-bootstrap replicates.", 1000)

    def __post_init__(self):
        at_least_one(self, "bootstrap")


def at_least_one(config, name: str) -> None:
    """Refuse a count below 1 (None: the field's default applies) in one line naming it."""
    value = getattr(config, name)
    if value is not None and value < 1:
        raise GrailError(f"{name}: expected at least 1, got {value}")
