"""What a pipeline run tells in MLflow at a glance: the parent run's description, the best
baseline by name, and each registered model version's description and tags.

- The experiment is a model-training one (MLflow's ``mlflow.experimentKind`` experiment tag,
  ``custom_model_development``): MLflow 3 opens an untagged experiment in its GenAI view.
- The parent run's description (``mlflow.note.content``, Markdown, shown on the run's page):
  what ran, one row per issue and algorithm (accuracy, log-loss against step 0, best baseline,
  ceiling), the algorithm differences, and links to each benchmark report and the comparison.
- A model version carries its validation figures, the data fingerprint, its source run, where
  its benchmark report is and where it was exported: the export task registers the exported
  model by reference (its source is the export, MLflow holds no copy) and describes it.

The texts are built by pure functions (tested on their own); the few MLflow calls are here too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
NOTE_TAG = "mlflow.note.content"
# A saved view of the runs table (the UI's "Views" menu) is an experiment tag holding the
# table's state; a link with ``viewStateShareKey`` opens it (MLflow 3.17's UI: checked in
# Chromium, tests/test_pipeline.py). ``workflowType=machine_learning`` opens the model-training
# pages: 3.17's UI decides GenAI or not from the link or the browser's last choice, not from
# the experiment's kind tag (which grail sets all the same).
VIEW_KEY = "grail-headline"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"


@dataclass(frozen=True)
class Notes:
    """What a task says in the parent run's description: its headline fields (the runs
    table's columns), the table's header, one row per branch, the intervals' line."""

    fields: tuple[str, ...]
    table: tuple[str, ...]
    row: Callable[[dict, str, str, str, str | None], str]  # values, issue, algorithm, exp, bench
    intervals: str


RUN_NAME = "attributes.`Run Name`"
logger = logging.getLogger(__name__)


def runs_page(experiment_id: str) -> str:
    """The experiment's runs page (relative to the UI) with the headline columns.

    >>> runs_page("3")
    '#/experiments/3/runs?viewStateShareKey=grail-headline&workflowType=machine_learning'
    """
    query = f"viewStateShareKey={VIEW_KEY}&workflowType=machine_learning"
    return f"#/experiments/{experiment_id}/runs?{query}"


def headline_view(
    issues: list[str], algorithms: list[str], fields: tuple[str, ...], previous: str | None = None
) -> str:
    """The saved view's tag value: the run name wide enough to read, then each branch's
    headline metrics (`fields`: the task's) as columns (those of an earlier view of the
    experiment kept first).

    >>> import json
    >>> fields = ("accuracy", "log_loss")
    >>> state = json.loads(json.loads(headline_view(["gun_control"], ["grpo"], fields))["state"])
    >>> state["selectedColumns"][:2]
    ['metrics.`gun_control/grpo/accuracy`', 'metrics.`gun_control/grpo/log_loss`']
    >>> state["columnWidths"][RUN_NAME]
    420
    """
    import json
    import time

    columns = []
    if previous:
        try:
            columns = json.loads(json.loads(previous)["state"])["selectedColumns"]
        except (ValueError, KeyError, TypeError):
            columns = []
    for issue in issues:
        for algorithm in algorithms:
            for field in fields:
                column = f"metrics.`{issue}/{algorithm}/{field}`"
                if column not in columns:
                    columns.append(column)
    state = {
        "searchFilter": "",
        "orderByKey": "attributes.start_time",
        "orderByAsc": False,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "datasetsFilter": [],
        "modelVersionFilter": "All Runs",
        "selectedColumns": columns,
        "columnOrder": [RUN_NAME, *columns],
        "columnWidths": {RUN_NAME: 420} | {c: 170 for c in columns},
    }
    now = int(time.time() * 1000)
    view = {"name": "grail headline", "createdAt": now, "updatedAt": now}
    return json.dumps(view | {"state": json.dumps(state)})


def registered_model_name(issue: str, algorithm: str) -> str:
    """The registered model a branch's trained model becomes a version of.

    >>> registered_model_name("gun_control", "grail")
    'grail-gun_control-grail'
    """
    return f"grail-{issue}-{algorithm}"


def best_baseline_tag(issue: str, algorithm: str) -> str:
    """The parent run's tag naming the baseline of ``ISSUE/ALGORITHM/best_baseline_accuracy``."""
    return f"{issue}/{algorithm}/best_baseline"


def artifact_link(experiment_id: str, run_id: str, path: str = "") -> str:
    """A link, relative to the MLflow UI, to a run's artifact (its page when `path` is empty).

    >>> artifact_link("1", "abc", "benchmark/report.md")
    '#/experiments/1/runs/abc/artifacts/benchmark/report.md'
    """
    page = f"#/experiments/{experiment_id}/runs/{run_id}"
    return f"{page}/artifacts/{path}" if path else page


def _number(value, digits: int = 3, sign: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _interval(low, high, sign: bool = False) -> str:
    if low is None or high is None:
        return ""
    return f" [{_number(low, 3, sign)}, {_number(high, 3, sign)}]"


def change(values: dict, metric: str) -> str:
    """The final model minus step 0 on `metric` with its interval (``-0.027 [-0.085, +0.031]``)."""
    key = f"final_minus_start/{metric}"
    difference = values.get(f"{key}_difference")
    if difference is None:
        return "–"
    low, high = values.get(f"{key}_ci_low"), values.get(f"{key}_ci_high")
    return _number(difference, sign=True) + _interval(low, high, sign=True)


def best_baseline_text(values: dict, metric: str) -> str:
    """The best baseline and its figure on `metric` (``ranker 0.560``), or "–".

    >>> best_baseline_text({"best_baseline": "ranker", "best_baseline_accuracy": 0.56}, "accuracy")
    'ranker 0.560'
    """
    best = values.get("best_baseline")
    return f"{best} {_number(values.get(f'best_baseline_{metric}'))}" if best else "–"


def report_link(experiment_id: str, bench: str | None) -> str:
    """A link to a branch's benchmark report (its benchmark run `bench`), or "–"."""
    return (
        f"[report]({artifact_link(experiment_id, bench, 'benchmark/report.md')})" if bench else "–"
    )


def version_tags(
    issue: str, algorithm: str, run: str, figures: dict, fingerprint: str | None, sources: dict
) -> dict[str, str]:
    """A model version's tags: its branch and run, the task's `figures`, where it came from;
    those without a value left out."""
    tags = {"issue": issue, "algorithm": algorithm, "kfp_run_id": run, **figures}
    tags |= source_tags(fingerprint, sources)
    return {k: v for k, v in tags.items() if v and v != "–"}


def version_text(head: str, sources: dict, *more: str) -> str:
    """A model version's description: `head` lines, `more`, and where its report is."""
    report = (
        [f"Benchmark report: {sources['benchmark_report']}"]
        if sources.get("benchmark_report")
        else []
    )
    return "\n".join([head, *more, *report])


def source_tags(fingerprint: str | None, sources: dict[str, str]) -> dict[str, str]:
    """Where a model version came from: its data, runs, report and export."""
    return {
        "data_fingerprint": fingerprint or "",
        "source_run": sources.get("train_run", ""),
        "benchmark_run": sources.get("benchmark_run", ""),
        "benchmark_report": sources.get("benchmark_report", ""),
        "export_location": sources.get("export_location", ""),
    }


def branch_values(metrics: dict, tags: dict, issue: str, algorithm: str) -> dict:
    """One branch's headline as the parent run holds it (``ISSUE/ALGORITHM/FIELD`` metrics and
    the best baseline's tag)."""
    prefix = f"{issue}/{algorithm}/"
    values = {k[len(prefix) :]: v for k, v in metrics.items() if k.startswith(prefix)}
    if tags.get(best_baseline_tag(issue, algorithm)):
        values["best_baseline"] = tags[best_baseline_tag(issue, algorithm)]
    if tags.get(f"collapsed.{issue}.{algorithm}"):
        values["collapsed"] = tags[f"collapsed.{issue}.{algorithm}"]
    return values


def parent_note(
    params: dict,
    tags: dict,
    metrics: dict,
    children: dict[str, str],
    experiment_id: str,
    notes: Notes,
) -> str:
    """The parent run's Markdown description: what ran, the headline table (the task's
    `notes`: its header, a row per branch, its intervals), the algorithm differences, links to
    the reports (`children`: stage run name -> run id).

    >>> note = parent_note({"algorithms": "grpo", "issues": "gun_control", "recipe": "r.yaml",
    ...     "base_model": "tiny", "runner": "kfp.local subprocess"}, {"kfp_run_id": "r1",
    ...     "gun_control/grpo/best_baseline": "ranker"}, {"gun_control/grpo/accuracy": 0.4,
    ...     "gun_control/grpo/best_baseline_accuracy": 0.56}, {"benchmark:gun_control:grpo": "b1"},
    ...     "7", Notes(("accuracy",), ("| issue | algorithm | accuracy |", "|---|---|---|"),
    ...     lambda v, issue, algorithm, experiment, bench: f"| {issue} | {algorithm} | "
    ...     f"{v['accuracy']:.3f} | [report]({artifact_link(experiment, bench, 'r.md')})",
    ...     "Intervals: none."))
    >>> print(*note.splitlines()[0].split("; "), sep=";" + chr(10))
    **grail run r1**: grpo on gun_control;
    recipe r.yaml;
    base model tiny;
    ran on kfp.local subprocess.
    >>> "| gun_control | grpo | 0.400 |" in note, note.splitlines()[-3]
    (True, 'Intervals: none.')
    >>> "[report](#/experiments/7/runs/b1/artifacts/r.md)" in note
    True
    >>> note = parent_note({}, {}, {}, {"counterfactual:gun_control:grpo": "c1"}, "7",
    ...     Notes((), (), lambda *_: "", ""))
    >>> "[gun_control grpo](#/experiments/7/runs/c1/artifacts/counterfactual/gun_control-g" in note
    True
    """
    algorithms = [a for a in params.get("algorithms", "").split(",") if a]
    issues = [i for i in params.get("issues", "").split(",") if i]
    where = params.get("runner") or params.get("image", "")
    lines = [
        f"**grail run {tags.get('kfp_run_id', '')}**: {' and '.join(algorithms)} on "
        f"{', '.join(issues)}; recipe {params.get('recipe', '–')}; base model "
        f"{params.get('base_model', '–')}; ran on {where or '–'}.",
        "",
        *notes.table,
    ]
    for issue in issues:
        for algorithm in algorithms:
            v = branch_values(metrics, tags, issue, algorithm)
            if v:
                bench = children.get(f"benchmark:{issue}:{algorithm}")
                lines.append(notes.row(v, issue, algorithm, experiment_id, bench))
    compared = sorted(k for k in metrics if k.startswith("compare/"))
    if compared:
        lines += ["", "Algorithm differences (paired on the same rows):", ""]
        for key in compared:
            _, issue, label, metric = key.split("/", 3)
            lines.append(
                f"- {issue}, {label.replace('_minus_', ' minus ')}, {metric}: {metrics[key]:+.3f}"
            )
    reports = []
    for name, run_id in sorted(children.items()):  # each branch's counterfactual report
        stage, _, branch = name.partition(":")
        if stage == "counterfactual":
            issue, algorithm = branch.split(":")
            path = f"counterfactual/{issue}-{algorithm}.md"
            reports.append(f"[{issue} {algorithm}]({artifact_link(experiment_id, run_id, path)})")
    if reports:  # docs/counterfactual.md
        lines += ["", "Counterfactual sessions, truth beside each simulator: " + ", ".join(reports)]
    links = [
        f"[{name}]({artifact_link(experiment_id, run_id)})"
        for name, run_id in sorted(children.items())
    ]
    lines += ["", notes.intervals]
    if links:
        lines += ["", "Stage runs: " + ", ".join(links)]
    return "\n".join(lines)


def write_parent_note(parent_id: str, notes_of: Callable[[str | None], Notes]) -> None:
    """The parent run's description from what the run logged (the finish task writes it), in
    the words of the run's task (its ``task`` param; `notes_of` gives that task's notes)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    run = client.get_run(parent_id)
    children = {
        r.info.run_name: r.info.run_id
        for r in client.search_runs(
            [run.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'"
        )
    }
    notes = notes_of(run.data.params.get("task"))  # None: a run from before tasks were recorded
    note = parent_note(
        run.data.params, run.data.tags, run.data.metrics, children, run.info.experiment_id, notes
    )
    client.set_tag(parent_id, NOTE_TAG, note)
