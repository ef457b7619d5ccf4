"""What is particular to each task grail trains simulators for, looked up in one registry.

:data:`TASKS` maps a task's name to its entry (:class:`TaskEntry`): every task has the same
parts (:data:`PARTS`), each a name in the task's folder, imported when first used. The stages
look a task up once (``TASKS[config.task]``) and ask it for a part; they never compare task
names. The task a cleaned dataset or a trained model holds is recorded once, in the dataset's
``audit.json`` and the model's ``prompt.json``, and read with :func:`recorded_task`. A command's
options that come from a task (its ``recipe_fields``, its ``counterfactual_config``) are found
with :func:`task_options`.

- ``slate``: which video a person clicks next from a recommendation slate (the GRAIL study):
  :mod:`grail.tasks.slate`.
- ``summarize``: document summaries scored by how many hidden questions a reader answers from
  them (OpenPipe's Summary-RL on RepLiQA): :mod:`grail.tasks.summarize`.

Adding a task = a folder with these parts + one entry: here (``BUILT_IN``) for a task shipped
with grail, or the ``grail.tasks`` entry point of the package that ships it (docs/tasks.md).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

# Every task's parts: the name each has in the task's folder ("module:attribute", relative to
# the task's package), and what it is.
PARTS = {
    "simulate": "write a synthetic study: f(out, participants, documents, seed, layout, choices) "
    "-> lines",
    "recipe_fields": "the task's own fields of a training recipe, `grail prompt`, `grail "
    "generate` and `grail benchmark` (a dataclass whose __post_init__ checks them; "
    "task_options): None where the task has none beside training's own",
    "show_prompt": "what `grail prompt` prints of one row of a cleaned dataset: f(path, split, "
    "row, options) -> text; None where the task has none",
    "audit": "`grail audit` of a cleaned dataset (position baselines, leakage detectors): "
    "f(path, json_out) -> the audit as Markdown; None where the task has none",
    "check_benchmark": "refuse a malformed benchmark option of the task's own (a reader, a "
    "judge), one line; every benchmark checks every task's: f(config) -> None",
    "policy_reward": "the class of the task's rewards that read the policy, bound to it when "
    "training begins (bind(policy, tokenizer, packer)); None where the task has none",
    "cloning_examples": "behaviour cloning's rows (sft_dataset: choices) and, for each, its "
    "prompt as GRPO sees it, its slate's size and the reply that picks the person's choice: "
    "f(config, folder, split, limit) -> (rows, [{prompt, n_options, reply}]); None where the "
    "task has no choices to clone",
    "cloning_answer": "the longest answer a cloned reply closes its thought with (what a "
    "cloned thought leaves room for): f(config) -> text; None where the task clones none",
    "reply_choice": "the option a reply names, as GRAIL's discriminator reads it: f(text, "
    "n_options) -> number or None; None where the task has no GRAIL (gail)",
    "discriminator_text": "GRAIL's discriminator input, an option chosen in its prompt: "
    "f(prompt, option, context) -> text, or None for an option the prompt lacks; None where "
    "the task has no GRAIL (gail)",
    "discriminator_features": "what GRAIL's feature discriminator (gail_discriminator: "
    "features) reads of a discriminator text: f(text) -> [feature] (the viewer crossed with "
    "the choice); None where the task has no GRAIL (gail)",
    "counterfactual_config": "the options of `grail counterfactual` (a dataclass; "
    "task_options): None where the task has none",
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
    "target, prompt_weight=0.0) -> losses",
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
    "subject_names": "the short name of a subject its branches train on, in recipe paths "
    "({issue}) and model names (grpo-gun): {subject: short}; a subject not named keeps its name",
    "dag": "the task's DAG (a :class:`Dag`): its name, file, own parameters and defaults; "
    "grail.pipelines.dag builds it with the parameters every task's DAG shares",
    "counterfactual_branch": "a branch's counterfactual sessions (the DAG's counterfactual "
    "task): f(dataset, out, model, algorithm, start_model, recommenders, viewers, steps, seed, "
    "subject) -> headline metrics; None where the task has none",
}


@dataclass(frozen=True)
class Parameter:
    """One parameter of a task's DAG: its name, type (str, int, float, bool, list, dict, as
    KFP reads them), default and the line the Kubeflow UI shows."""

    name: str
    type: type
    default: Any
    doc: str


@dataclass(frozen=True)
class Dag:
    """A task's DAG, as :func:`grail.pipelines.dag.pipeline` builds it: the parameters every
    task shares (recipe, algorithms, pools, secrets, ...) and the task's own."""

    name: str  # the pipeline's name (pipelineInfo)
    file: str  # the compiled DAG's file name, beside grail.pipelines (grail.yaml)
    description: str  # the pipeline's description (one sentence)
    parameters: tuple[Parameter, ...]  # the task's own, listed after raw_uri
    defaults: dict[str, tuple[Any, str]]  # a shared parameter's default and line, the task's
    clean_inputs: Any  # f(parameters) -> the clean component's study inputs (participants,
    # documents, seed, validation_fraction, validation_documents), from the DAG's parameters
    subjects: str | None = None  # the parameter listing the branches' subjects (the slate
    # task's issues); None: the task's branch_subjects of none


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


def _entry(name: str, package: str) -> TaskEntry:
    return TaskEntry(name, package, importlib.import_module(package).PARTS)


# The tasks grail ships, each a folder here; a package of its own adds a task through the
# entry point group "grail.tasks" (name = its package: ``parity = toy_tasks.parity``).
BUILT_IN = ("slate", "summarize")
TASKS: dict[str, TaskEntry] = {name: _entry(name, f"grail.tasks.{name}") for name in BUILT_IN}
TASKS |= {
    point.name: _entry(point.name, point.value)
    for point in entry_points(group="grail.tasks")
    if point.name not in BUILT_IN
}
Task = Literal[tuple(TASKS)]  # a config field naming a task: one of the registered ones
DEFAULT_TASK = "slate"  # what a dataset or model recorded before the task was recorded is


def task_options(part: str) -> type:
    """The dataclass of options a command (or a training recipe) takes from the tasks' `part`
    (``recipe_fields``, ``counterfactual_config``): the one task's that has it, or, where
    several tasks have one, a dataclass of all their fields (a name two tasks both use is
    refused: it would mean two things), whose check runs each task's.

    >>> task_options("recipe_fields").__name__
    'PromptOptions'
    """
    from dataclasses import fields

    kinds = list(dict.fromkeys(k for k in (getattr(e, part) for e in TASKS.values()) if k))
    if not kinds:
        raise ValueError(f"{part}: no task has one")
    if len(kinds) == 1:
        return kinds[0]
    names = [f.name for kind in kinds for f in fields(kind)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{part}: fields {twice} are two tasks' options")

    def __post_init__(self):
        for kind in kinds:
            getattr(kind, "__post_init__", lambda _: None)(self)

    merged = type(f"TaskOptions_{part}", tuple(kinds), {"__post_init__": __post_init__})
    return dataclass(merged)


def short_name(subject: str) -> str:
    """A subject's short name (the task's ``subject_names``: ``gun`` for gun_control), or the
    name itself for a subject no task shortens.

    >>> short_name("gun_control"), short_name("documents")
    ('gun', 'documents')
    """
    for entry in TASKS.values():
        if subject in entry.subject_names:
            return entry.subject_names[subject]
    return subject


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
