"""The summarize task's training examples: each document's prompt with the columns its rewards
read, and the prompt record."""

from __future__ import annotations

from pathlib import Path

from grail.core.errors import GrailError

GAIL = False  # no discriminator: GRPO only (check_training refuses gail_use)
TRAINS_WITH_API = True  # the recipe's summary_reader may be an API model (grail.tasks.PARTS)
# What the summarize task has none of (grail.tasks.PARTS): fields of its own beside training's
# (summary_*, in grail.train.fields), a prompt of one row or an audit of its rows to show,
# counterfactual sessions' options, and choices (behaviour cloning's, GRAIL's discriminator's).
RECIPE_FIELDS = None
SHOWN_PROMPT = None
AUDIT = None
COUNTERFACTUAL_CONFIG = None
CLONING = None
DISCRIMINATOR = None


def examples(config, folder: Path, split: str, limit: int | None):
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


def prompt_record(config) -> dict:
    """How the model was asked: the summary's mode, budget and length, its reader and judge."""
    return {
        "summary_mode": config.summary_mode,
        "summary_budget": config.summary_budget,
        "max_new_tokens": config.max_completion_length,
        "summary_reader": config.summary_reader,
        "summary_judge": config.summary_judge,
    }


def check_training(fields) -> None:
    """What the summarize task cannot do (yet), one line each."""
    from grail.tasks.summarize.prompt import MODES

    if fields.summary_mode not in MODES:
        raise GrailError(f"summary_mode must be one of {list(MODES)}, got {fields.summary_mode!r}")
    if fields.summary_budget is not None and fields.summary_budget < 1:
        raise GrailError(f"summary_budget must be at least 1, got {fields.summary_budget}")
    if fields.gail_use:
        raise GrailError("gail_use: the summarize task has no discriminator; GRPO only")
    if fields.sft_dataset == "choices":
        raise GrailError("sft_dataset: choices clones slate choices; the summarize task has none")
    from grail.tasks.summarize.model_reader import check_reader_spec

    check_reader_spec(fields.summary_reader, "summary_reader")
    check_reader_spec(fields.summary_judge, "summary_judge")
    if fields.summary_judge and not fields.summary_reader:
        raise GrailError("summary_judge: a judge needs a summary_reader whose answers it judges")


def check_benchmark(config) -> None:
    """The benchmark's reader and judge, each ``openai:NAME`` or ``openai:NAME@URL``, one line
    each (every benchmark checks them, whatever task it scores)."""
    from grail.tasks.summarize.model_reader import check_reader_spec

    check_reader_spec(config.reader, "reader")
    check_reader_spec(config.judge, "judge")


def before_training(config, weights: list[float], dataset) -> None:
    """The model reader and judge, when the recipe names them, each asked one request before
    anything trains: one that cannot be reached or refuses the model stops here in one line
    (the summarize task's rewards have no collapse to guard against)."""
    if config.summary_reader:
        from grail.tasks.summarize.rewards import reader_for

        reader_for(config.summary_reader, config.summary_judge).probe()


def tracked_rows(path: Path, issue: str):
    """Every document of a split (a parquet file) for MLflow, in the flat columns its schema
    inference reads; no target."""
    import pyarrow.parquet as pq

    columns = ["document_id", "document_topic", "text", "split"]
    return pq.read_table(path, columns=columns).to_pandas(), None


def branch_rows(dataset: Path, issue: str, scratch: Path) -> tuple[Path, str]:
    """A branch's rows: every document of the dataset, as it is (`issue` names the branch)."""
    return dataset, str(dataset)


SUBJECT = "summarize"  # the one subject of a run's branches: the documents (names and paths)
SUBJECT_NAMES: dict[str, str] = {}  # the subject's name is short already


def branch_subjects(issues: list[str]) -> list[str]:
    """A run's branches train on the documents, one subject whatever the issues (the slate
    task's: the summarize DAG has none, and ``grail run --local --task summarize`` leaves its
    default issues unused)."""
    return [SUBJECT]
