"""The examples training sees: the cleaned dataset's rows of the recipe's issues and studies (or
the summarize task's documents) as conversational prompts, with the columns the rewards read,
and ``prompt.json``, the record of how the model was asked (``grail benchmark`` asks it the
same way). An ``s3://`` dataset is downloaded once per node.
"""

from __future__ import annotations

from pathlib import Path

from grail.core.errors import GrailError
from grail.train.config import TrainConfig


def load_examples(config: TrainConfig, split: str, limit: int | None):
    """A ``datasets.Dataset`` of prompts (conversational) and the columns the rewards read."""
    from datasets import Dataset

    from grail.core.prompts import to_example

    if config.task == "summarize":
        with config.main_process_first(local=True, desc="dataset download"):
            folder = local_dataset(config.dataset, Path(config.output_dir) / ".dataset")
        return Dataset.from_list(document_examples(config, folder, split, limit))
    options = prompt_options(config)
    return Dataset.from_list([to_example(row, options) for row in slate_rows(config, split, limit)])


def slate_rows(config: TrainConfig, split: str, limit: int | None) -> list[dict]:
    """The cleaned dataset's rows of `split` in the recipe's issues and studies (first `limit`)."""
    from grail.core.contract import read_dataset

    with config.main_process_first(local=True, desc="dataset download"):
        folder = local_dataset(config.dataset, Path(config.output_dir) / ".dataset")
    rows = [
        r
        for r in read_dataset(folder, split=split).to_pylist()
        if (not config.issues or r["issue"] in config.issues)
        and (not config.studies or r["study"] in config.studies)
    ]
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise GrailError(f"{config.dataset}: no {split} rows left after the issue/study filter")
    return rows


def document_examples(config: TrainConfig, folder: Path, split: str, limit: int | None):
    """The summarize task's prompts, with the columns its rewards read (the model reader and
    judge too, when the recipe names them: RepLiQA's questions need them)."""
    from grail.tasks.summarize.clean import read_documents
    from grail.tasks.summarize.prompt import BUDGETS, build_messages

    budget = config.summary_budget or BUDGETS[config.summary_mode]
    reader = bool(config.summary_reader)
    return [
        {
            "prompt": build_messages(doc["sentences"], config.summary_mode, budget),
            "sentences": doc["sentences"],
            "questions": doc["questions"],
            "summary_mode": config.summary_mode,
            "summary_budget": budget,
            **(
                {"summary_reader": config.summary_reader, "summary_judge": config.summary_judge}
                if reader
                else {}
            ),
        }
        for doc in read_documents(folder, split, limit, model_reader=reader)
    ]


def prompt_options(config: TrainConfig):
    """The prompt fields of the training config (it extends PromptOptions)."""
    from dataclasses import fields

    from grail.core.prompts import PromptOptions

    return PromptOptions(**{f.name: getattr(config, f.name) for f in fields(PromptOptions)})


def prompt_record(config: TrainConfig) -> dict:
    """How the model was trained to be asked: ``prompt.json`` beside the model and in every
    checkpoint, so `grail benchmark` evaluates it the same way."""
    from dataclasses import asdict

    if config.task == "summarize":
        return {
            "task": "summarize",
            "summary_mode": config.summary_mode,
            "summary_budget": config.summary_budget,
            "max_new_tokens": config.max_completion_length,
            "summary_reader": config.summary_reader,
            "summary_judge": config.summary_judge,
        }
    return asdict(prompt_options(config)) | {"max_new_tokens": config.max_completion_length}


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
