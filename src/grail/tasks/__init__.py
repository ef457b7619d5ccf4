"""What is particular to each task grail trains simulators for, looked up in one registry.

:data:`TASKS` maps a task's name to its entry (:class:`TaskEntry`): every task has the same
parts (:data:`PARTS`), each a name in the task's folder, imported when first used. The stages
look a task up once (``TASKS[config.task]``) and ask it for a part; they never compare task
names. The task a cleaned dataset or a trained model holds is recorded once, in the dataset's
``audit.json`` and the model's ``prompt.json``, and read with :func:`recorded_task`.

- ``slate``: which video a person clicks next from a recommendation slate (the GRAIL study):
  :mod:`grail.tasks.slate`.
- ``summarize``: document summaries scored by how many hidden questions a reader answers from
  them (OpenPipe's Summary-RL on RepLiQA): :mod:`grail.tasks.summarize`.

Adding a task = a folder with these parts + one entry here (docs/tasks.md).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Task = Literal["slate", "summarize"]

# Every task's parts: the name each has in the task's folder ("module:attribute", relative to
# the task's package), and what it is.
PARTS = {
    "simulate": "write a synthetic study: f(out, participants, documents, seed, layout) -> lines",
    "clean": "raw export -> cleaned splits and audit: f(raw, out, config) -> audit",
    "cleaned": "what `grail clean` prints of the audit: f(audit, out) -> text",
    "audit_markdown": "the audit as Markdown (the pipeline's audit artifact): f(audit) -> text",
    "audit_counts": "the audit's counts, as metrics: f(audit) -> {name: number}",
    "clean_params": "what the pipeline's clean run records: f(config, participants, "
    "documents) -> {synthetic: the study's size, setting: value, ...}",
    "branch_subjects": "what a run's branches train on, from the run's issues: f(issues) -> "
    "[subject] (the slate task's issues; the summarize task's one subject, its documents)",
    "rewards": "the rewards recipes name: {name: reward function or class}",
    "default_rewards": "the rewards a recipe that names none trains with: [name] (a proper "
    "one where the task has it: optimal at people's own distribution)",
    "reward_notes": "what each reward pays and is optimal at, for `grail train --help`: "
    "{name: one line}",
    "check_training": "refuse what the task cannot train, one line: f(fields) -> None",
    "examples": "training prompts with the columns the rewards read: f(config, folder, split, "
    "limit) -> rows",
    "prompt_record": "how a trained model is asked (prompt.json): f(config) -> dict",
    "before_training": "before training: a warning about the recipe, a probe of its endpoints "
    "(refused in one line): f(config, weights, dataset)",
    "warmup_conversations": "the tiny model's text: f(data or None, limit) -> conversations",
    "warm_up": "the tiny model's format warm-up: f(model, tokenizer, chats, steps, seed, data, "
    "target) -> losses",
    "answer_samples": "replies the tiny tokenizer learns beside the conversations: [text]",
    "warmup_targets": "what the warm-up's answer may be trained toward: (uniform, ...)",
    "warmup_steps": "the embedded default's tiny policy: format warm-up steps",
    "gail": "whether the task trains GRAIL (the tiny run builds a discriminator)",
    "tracked_rows": "a split's rows of a branch as MLflow's dataset input: f(path, issue) -> "
    "(DataFrame, targets column or None)",
    "branch_rows": "the rows a branch is benchmarked on and their label: f(dataset, issue, "
    "scratch folder) -> (data, label)",
    "embedded": "the embedded default's settings (grail run --local): {recipe, algorithms, "
    "max_steps, mlflow_experiment, folder}",
    "embedded_arguments": "the task's own DAG arguments of a local run, checked: f(config) -> "
    "{name: value}",
    "notes": "what the task says in MLflow's parent run (grail.core.run_notes.Notes)",
    "version_story": "a registered model version's description and tags: f(headline, issue, "
    "algorithm, run, fingerprint, sources) -> (text, tags)",
    "promotion": "whether a benchmarked model may be promoted (the pipeline's promote_if "
    "beats_prior), and why: f(headline) -> (passed, reason in words)",
    "trains_with_api": "whether training may ask an API model (its pod gets the OpenAI key)",
    "benchmark": "the benchmark stage's run on the task's rows (`grail benchmark`): f(config, "
    "prompt, label, trained, branch) -> metrics, written to config.out and logged to MLflow "
    "(the slate task: an option per row, log-loss against people's; the summarize task: a "
    "text per document, read by a reader)",
    "benchmark_metrics": "a benchmark's metrics under stable names, as MLflow gets them: "
    "f(metrics, trained) -> [(key, value, step)]",
    "benchmark_fields": "the fields of each system's final metrics the pipeline's benchmark "
    "task returns: (field, ...)",
    "headline": "a benchmark's headline, the trained model against its references (the "
    "pipeline run's summary, the promotion gate, the closing table): f(metrics, trained) -> "
    "{field: value}",
    "closing_table": "what `grail run --local` prints of its branches' headlines: f(rows, "
    "comparison) -> text",
    "compare": "the algorithms of one run compared per issue (`grail compare`): f(results, "
    "out, bootstrap) -> comparison, written to out; None where the task has none",
    "compare_headline": "a comparison's differences as MLflow metrics: f(comparison) -> "
    "{key: number}; None where the task has no comparison",
    "counterfactual": "sessions under other recommenders (`grail counterfactual`): f(config) "
    "-> results; None where the task has none",
    "generation": "what `grail generate` asks a teacher and keeps of its replies "
    "(a :class:`Generation`), or None where the task has no generate stage",
}


@dataclass(frozen=True)
class Generation:
    """A task's part of the generate stage (distilabel against a teacher; the stage itself is
    the same for every task): the requests, the rows they become, how they are scored, which
    become SFT conversations and preference pairs."""

    rewards: tuple[str, ...]  # the rewards a reply is scored with when none are named
    inputs: Any  # f(data, config, options, template) -> distilabel inputs (system_prompt,
    # instruction and what scoring needs), each prompt config.num_generations times
    record: Any  # f(output, model, config) -> a generated.parquet row (prompt, completion, ...)
    score: Any  # f(records, rewards, weights) -> None: reward_NAME, reward, parsed, correct
    keep: Any  # f(records) -> (sft rows with messages, preference pairs)
    schemas: Any  # f() -> (sft.parquet's schema, preferences.parquet's schema)


@dataclass(frozen=True)
class TaskEntry:
    """One task: its name, its package, and where each of :data:`PARTS` lives in it."""

    name: str
    package: str
    parts: dict[str, str]

    def __post_init__(self):
        missing = sorted(set(PARTS) - set(self.parts))
        extra = sorted(set(self.parts) - set(PARTS))
        if missing or extra:
            raise ValueError(f"task {self.name}: parts missing {missing}, unknown {extra}")

    def __getattr__(self, part: str) -> Any:
        if part not in PARTS:
            raise AttributeError(f"task {self.name} has no part {part!r} (parts: {sorted(PARTS)})")
        module, _, attribute = self.parts[part].partition(":")
        return getattr(importlib.import_module(f"{self.package}.{module}"), attribute)


def _entry(name: str) -> TaskEntry:
    package = f"grail.tasks.{name}"
    return TaskEntry(name, package, importlib.import_module(package).PARTS)


TASKS: dict[str, TaskEntry] = {name: _entry(name) for name in ("slate", "summarize")}
DEFAULT_TASK = "slate"  # what a dataset or model recorded before the task was recorded is


def recorded_task(folder: str | Path | None, record: str = "audit.json") -> str:
    """The task a cleaned dataset (its ``audit.json``) or a trained model (its
    ``prompt.json``) holds; one recorded before tasks were (or no folder): the slate task.

    >>> recorded_task(None)
    'slate'
    """
    folder = Path(folder) if folder else None
    if folder and folder.is_file():  # a split's parquet file: its folder's record
        folder = folder.parent
    path = folder / record if folder else None
    if not path or not path.is_file():
        return DEFAULT_TASK
    task = json.loads(path.read_text()).get("task", DEFAULT_TASK)
    if task not in TASKS:
        raise ValueError(f"{path}: task {task!r} is none of {sorted(TASKS)}")
    return task
