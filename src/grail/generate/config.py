"""The generate stage's settings (``grail generate``): the pipeline reads its defaults from
here without importing the stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grail.core.config import option
from grail.core.errors import GrailError


@dataclass(kw_only=True)
class GenerateConfig:
    """grail generate: completions from a model server (distilabel), scored by the rewards;
    the kept ones become SFT rows (slate: the correct choices; summarize: each document's
    best summary), better/worse pairs preference rows."""

    data: str = option("Cleaned folder or parquet file.")
    out: str = option("Output folder.")
    model: str = option("openai:NAME@URL (vllm serve, transformers serve) or openai:NAME.")
    num_generations: int = option("Completions per prompt.", 4)
    split: str = option("Split to generate for.", "train")
    limit: int | None = option("The first N rows only.", None)
    template: str | None = option(
        "Jinja template file replacing the user prompt (it sees row, a contract row; the slate "
        "task's).",
        None,
    )
    summary_mode: Literal["extractive", "abstractive"] = option(
        "Task summarize: how the teacher is asked, as the recipe trains (extractive or "
        "abstractive).",
        "extractive",
    )
    summary_budget: int | None = option(
        "Task summarize: the budget stated in the prompt (default: 12 sentences, 1,200 "
        "characters), as the recipe trains.",
        None,
    )
    temperature: float = option("Sampling temperature.", 0.8)
    max_new_tokens: int = option("Tokens per completion.", 256)
    batch_size: int = option("Requests per distilabel batch.", 16)
    retries: int = option("Retries of one request (the openai client's, with backoff).", 3)
    timeout: float = option("Seconds before a request is given up.", 120.0)
    batch_retries: int = option("Retries of failed batches, one request at a time.", 2)
    rewards: list[str] | None = option(
        "Reward functions to score with; repeatable (default: the task's: slate accuracy and "
        "format; summarize answered and summary_format).",
        None,
        aliases=["--reward"],
        action="extend",
    )
    reward_weights: list[float] | None = option(
        "Weights of the rewards (default: equal).", None, action="extend"
    )

    def __post_init__(self):
        for name in ("max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise GrailError(f"{name}: expected at least 1, got {getattr(self, name)}")
        for name in ("retries", "batch_retries"):
            if getattr(self, name) < 0:
                raise GrailError(f"{name}: expected 0 or more, got {getattr(self, name)}")
        # (a value that is not finite is the parser's to refuse, naming where it came from)
        if self.temperature < 0:
            raise GrailError(f"temperature: expected 0 or more, got {self.temperature}")
        if self.timeout <= 0:
            raise GrailError(f"timeout: expected seconds above 0, got {self.timeout}")
        if self.num_generations < 1:
            raise GrailError(f"num_generations must be at least 1, got {self.num_generations}")
        if self.summary_budget is not None and self.summary_budget < 1:
            raise GrailError(f"summary_budget: expected at least 1, got {self.summary_budget}")
        if self.limit is not None and self.limit < 1:
            raise GrailError(f"limit: expected a whole number of at least 1, got {self.limit}")
