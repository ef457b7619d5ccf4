"""The examples training sees: the cleaned dataset's rows as conversational prompts with the
columns the rewards read (each task's own: ``examples`` of :data:`grail.tasks.TASKS`), and
``prompt.json``, the record of how the model was asked (``grail benchmark`` asks it the same
way). An ``s3://`` dataset is downloaded once per node.
"""

from __future__ import annotations

from pathlib import Path

from grail.core.errors import GrailError
from grail.tasks import TASKS
from grail.train.config import TrainConfig


def load_examples(config: TrainConfig, split: str, limit: int | None):
    """A ``datasets.Dataset`` of prompts (conversational) and the columns the rewards read."""
    from datasets import Dataset

    return Dataset.from_list(
        TASKS[config.task].examples(config, dataset_folder(config), split, limit)
    )


def dataset_folder(config: TrainConfig) -> Path:
    """The recipe's dataset as a local folder (downloaded once per node)."""
    with config.main_process_first(local=True, desc="dataset download"):
        return local_dataset(config.dataset, Path(config.output_dir) / ".dataset")


def prompt_record(config: TrainConfig) -> dict:
    """How the model was trained to be asked: ``prompt.json`` beside the model and in every
    checkpoint, so `grail benchmark` evaluates it the same way; it names the task."""
    return {"task": config.task} | TASKS[config.task].prompt_record(config)


def local_dataset(uri: str | None, cache: Path) -> Path:
    """A local path for the dataset, downloading an s3:// folder into `cache` first (once: the
    train and eval splits, and the node's other processes, find it there)."""
    if not uri:
        raise GrailError("no dataset: set `dataset` in the recipe or pass --dataset")
    if not uri.startswith("s3://"):
        return Path(uri.removeprefix("file://"))
    from grail.core.checkpoints import download_into_place
    from grail.core.storage import Location

    if not cache.is_dir():  # renamed into place whole: never seen half-written
        download_into_place(Location.parse(uri), cache, checkpoint=False)
    return cache
