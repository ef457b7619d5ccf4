"""The export stage's settings (``grail export``): loads neither kfp nor torch, so the light
command stays light."""

from __future__ import annotations

from dataclasses import dataclass

from grail.core.config import option


@dataclass(kw_only=True)
class ExportConfig:
    """grail export: the model, its benchmark and a manifest to S3 or a folder."""

    model: str = option("Final model folder.")
    benchmark: str | None = option("Benchmark output folder.", None)
    dest: str = option("s3://bucket/prefix, file://path or a path.")
    checkpoint: str = option(
        "Which of the run's models goes: best (the checkpoint the benchmark chose: the best "
        "held-out score, only where it beats the last by more than its interval; the model "
        "folder without a benchmark), last (the model folder), or a step number N (the model "
        "folder's checkpoint-N).",
        "best",
    )
    keep_stale: bool = option(
        "Keep the files the previous export here listed that this one no longer contains.", False
    )
    run_ids: list[str] = option(
        "Source run ids recorded in the manifest; repeatable.",
        [],
        aliases=["--run-id", "--run_id"],
        action="extend",
        metavar="KEY=ID",
    )
