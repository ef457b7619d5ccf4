"""The slate task's training examples: the cleaned dataset's rows of the recipe's issues and
studies as conversational prompts, with the columns the rewards read, and the prompt record."""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

from grail.core.errors import GrailError
from grail.tasks.slate.contract import read_dataset
from grail.tasks.slate.prompts import PromptOptions, to_example

GAIL = True  # GRAIL's discriminator tells people's choices from the policy's
TRAINS_WITH_API = False  # its rewards read the rows and the policy alone (grail.tasks.PARTS)


def examples(config, folder: Path, split: str, limit: int | None) -> list[dict]:
    """Each row of `split` (:func:`rows`) as a prompt with the columns the rewards read."""
    options = prompt_options(config)
    return [to_example(row, options) for row in rows(config, folder, split, limit)]


def rows(config, folder: Path, split: str, limit: int | None) -> list[dict]:
    """The cleaned dataset's rows of `split` in the recipe's issues and studies (first `limit`)."""
    found = [
        r
        for r in read_dataset(folder, split=split).to_pylist()
        if (not config.issues or r["issue"] in config.issues)
        and (not config.studies or r["study"] in config.studies)
    ]
    if limit is not None:
        found = found[:limit]
    if not found:
        raise GrailError(f"{config.dataset}: no {split} rows left after the issue/study filter")
    return found


def prompt_options(config) -> PromptOptions:
    """The prompt fields of the training config (it extends PromptOptions)."""
    return PromptOptions(**{f.name: getattr(config, f.name) for f in fields(PromptOptions)})


def prompt_record(config) -> dict:
    """How the model was asked: the prompt's settings and the reply's length."""
    return asdict(prompt_options(config)) | {"max_new_tokens": config.max_completion_length}


def check_training(fields) -> None:
    """Nothing of the slate task's is refused beyond the training fields' own checks: every
    algorithm, reward and warm start trains it."""


def check_benchmark(config) -> None:
    """Nothing of the slate task's is refused beyond the benchmark's own checks: it has no
    benchmark options of its own."""


def shown_prompt(path: str, split: str | None, row: int, options: PromptOptions) -> str:
    """What ``grail prompt`` prints of row `row` (of `split`, or of every row) of a cleaned
    dataset asked with `options`: each message, then the option the person chose."""
    table = read_dataset(path, split=split)
    if not 0 <= row < table.num_rows:
        raise GrailError(f"--row {row} is out of range: {path} has {table.num_rows} rows")
    example = to_example(table.slice(row, 1).to_pylist()[0], options)
    shown = [f"=== {m['role']} ===\n{m['content']}\n" for m in example["prompt"]]
    return "\n".join(shown) + f"\n=== gold ===\n{example['gold_index']} ({example['gold_id']})"


def tracked_rows(path: Path, issue: str):
    """The issue's rows of a split (a parquet file) for MLflow, the person's choice the target."""
    from grail.tasks.slate.contract import issue_rows

    return issue_rows(path, issue).to_pandas(), "gold_index"


def branch_rows(dataset: Path, issue: str, scratch: Path) -> tuple[Path, str]:
    """A branch's rows: the dataset's rows of its issue, written under `scratch`."""
    from grail.tasks.slate.contract import issue_subset

    issue_subset(dataset, issue, scratch)
    return scratch, f"{issue} of {dataset}"


def branch_subjects(issues: list[str]) -> list[str]:
    """A run's branches train on its issues (none given: every issue)."""
    from grail.tasks.slate.policy_issues import ISSUES

    return list(issues) or list(ISSUES)
