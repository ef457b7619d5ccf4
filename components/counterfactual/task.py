"""What the counterfactual task does: a branch's trained model, its step 0, the baselines and
the truth roll out every recommender on the issue's viewers
(:mod:`grail.tasks.slate.counterfactual`); the effects' errors, the replayed arm's differences
from people and the verdicts go to the parent MLflow run."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from grail.core import tracking
from grail.core.errors import reported
from grail.core.progress import show_progress
from grail.tasks.slate.counterfactual.config import JUDGED, JUDGED_LEVELS
from grail.tasks.slate.counterfactual.people import JUDGED_ON_PEOPLE


def start_of(model: str, base_models: str) -> str | None:
    """Step 0: the tiny policy (`base_models` given), else the local folder the training
    started from (its summary.json), else none (step 0 is left out)."""
    if base_models:
        return str(Path(base_models) / "policy")
    summary = Path(model) / "summary.json"
    start = json.loads(summary.read_text()).get("start_model") if summary.is_file() else None
    return start if start and Path(start).is_dir() else None


def headline(result: dict, issue: str) -> dict[str, float]:
    """The judged outcomes' effect errors (and the like-minded share's error on balanced
    slates, EFFECT the recommender), the differences from people on the replayed arm,
    and the verdicts, under stable names, the simulator and the outcome first (the MLflow UI
    cuts long names at the end): ``cf/ISSUE/SIMULATOR/OUTCOME_error/EFFECT``,
    ``cf/ISSUE/SIMULATOR/OUTCOME_vs_people`` and ``cf/ISSUE/MODEL/OUTCOME_gap_vs_BASELINE/
    EFFECT`` (EFFECT ``people`` for the verdicts against people). A baseline's or step 0's
    value is the same in every branch of the issue.

    >>> verdict = {"effect": "a-b", "model": "grpo", "metric": "slant", "gap": -0.02,
    ...            "baseline": "position_prior"}
    >>> effects = {"a-b/grpo/slant": {"effect": 1.0, "error": 0.1}, "a-b/truth/slant": {},
    ...            "a-b/grpo/reach": {"effect": 0.1, "error": 0.0}}
    >>> people = {"differences": {"grpo/first_slot": {"difference": 0.05},
    ...                           "grpo/reach": {"difference": 0.1}},
    ...           "verdicts": [verdict | {"metric": "first_slot", "gap": 0.01}]}
    >>> errors = {"random/grpo/like_minded": {"error": -0.04}, "random/grpo/drift": {"error": 1}}
    >>> headline({"effects": effects, "errors": errors, "verdicts": [verdict], "people": people},
    ...          "gun_control")
    ... # doctest: +NORMALIZE_WHITESPACE
    {'cf/gun_control/grpo/slant_error/a-b': 0.1,
     'cf/gun_control/grpo/like_minded_error/random': -0.04,
     'cf/gun_control/grpo/slant_gap_vs_position_prior/a-b': -0.02,
     'cf/gun_control/grpo/first_slot_vs_people': 0.05,
     'cf/gun_control/grpo/first_slot_gap_vs_position_prior/people': 0.01}
    """
    values = {}
    for key, entry in result.get("effects", {}).items():
        effect, simulator, metric = key.split("/")
        if "error" in entry and metric in JUDGED:
            values[f"cf/{issue}/{simulator}/{metric}_error/{effect}"] = entry["error"]
    for recommender, metric in JUDGED_LEVELS:  # an outcome judged under one recommender
        for key, entry in result.get("errors", {}).items():
            where, simulator, outcome = key.split("/")
            if (where, outcome) == (recommender, metric):
                values[f"cf/{issue}/{simulator}/{metric}_error/{recommender}"] = entry["error"]
    for v in result.get("verdicts", []):
        name = f"{v['model']}/{v['metric']}_gap_vs_{v['baseline']}/{v['effect']}"
        values[f"cf/{issue}/{name}"] = v["gap"]
    people = result.get("people", {"differences": {}, "verdicts": []})
    for key, entry in people["differences"].items():
        simulator, metric = key.split("/")
        if metric in JUDGED_ON_PEOPLE and entry["difference"] is not None:
            values[f"cf/{issue}/{simulator}/{metric}_vs_people"] = entry["difference"]
    for v in people["verdicts"]:
        values[f"cf/{issue}/{v['model']}/{v['metric']}_gap_vs_{v['baseline']}/people"] = v["gap"]
    return values


@reported("counterfactual")
def counterfactual_task(
    *, dataset: str, model: str, base_models: str, issue: str, algorithm: str,
    recommenders: list[str], viewers: int, steps: int, seed: int, parent: str, out: str,
) -> dict[str, float]:  # fmt: skip
    """The branch's counterfactual sessions under `out`; returns the headline metrics, also
    logged to the pipeline's parent run with the report."""
    from grail.tasks.slate.counterfactual.config import CounterfactualConfig
    from grail.tasks.slate.counterfactual.stage import run

    show_progress()
    config = CounterfactualConfig(
        data=dataset,
        out=out,
        models=[f"{algorithm}={model}"],
        start_model=start_of(model, base_models),
        recommenders=list(recommenders),
        viewers=viewers,
        steps=steps,
        seed=seed,
        issue=issue,
    )
    params = {"issue": issue, "algorithm": algorithm, "viewers": viewers, "steps": steps}
    with tracking.stage_run(parent, f"counterfactual:{issue}:{algorithm}", params) as own:
        values = {k: round(v, 6) for k, v in headline(run(config), issue).items()}
        tracking.log_metrics(own, values)
        with tempfile.TemporaryDirectory() as tmp:  # under their own names in MLflow
            named = shutil.copyfile(Path(out) / "report.md", Path(tmp) / f"{issue}-{algorithm}.md")
            tracking.log_artifacts(own, [named, Path(out) / "outcomes.svg"], "counterfactual")
            pipeline_run = tracking.pipeline_parent(parent)
            tracking.log_metrics(pipeline_run, values)
            tracking.log_artifacts(pipeline_run, [named], "counterfactual")
    return values


def run_counterfactual(
    *, dataset, model, base_models, tiny_model: bool, issue: str, algorithm: str,
    recommenders, viewers: int, steps: int, seed: int, parent_run: str, outcomes, report,
    charts, metrics,
) -> None:  # fmt: skip
    """The counterfactual component's body: :func:`counterfactual_task` into `outcomes`; the
    report and the chart also into their own artifacts for the Kubeflow UI; the headline into
    `metrics`."""
    values = counterfactual_task(
        dataset=dataset.path,
        model=model.path,
        base_models=base_models.path if tiny_model else "",
        issue=issue,
        algorithm=algorithm,
        recommenders=recommenders,
        viewers=viewers,
        steps=steps,
        seed=seed,
        parent=parent_run,
        out=outcomes.path,
    )
    shutil.copyfile(Path(outcomes.path) / "report.md", report.path)
    svg = (Path(outcomes.path) / "outcomes.svg").read_text()
    Path(charts.path).write_text(f"<html><body>{svg}</body></html>")
    for name, value in values.items():
        metrics.log_metric(name, value)
