"""A branch's counterfactual sessions, as the DAG's counterfactual task runs them (the
registry's ``counterfactual_branch``): the branch's model, its step 0, the baselines and the
truth roll out every recommender on the issue's viewers; the headline names the judged
outcomes' errors, the replayed arm's differences from people and the verdicts."""

from __future__ import annotations

from grail.tasks.slate.counterfactual.config import JUDGED, JUDGED_LEVELS
from grail.tasks.slate.counterfactual.people import JUDGED_ON_PEOPLE


def branch_sessions(
    *, dataset: str, out: str, model: str, algorithm: str, start_model: str | None,
    recommenders: list[str], viewers: int, steps: int, seed: int, subject: str,
) -> dict[str, float]:  # fmt: skip
    """The branch's sessions under `out` (report.md, outcomes.svg, ...); returns their
    headline (:func:`headline`)."""
    from grail.tasks.slate.counterfactual.config import CounterfactualConfig
    from grail.tasks.slate.counterfactual.stage import run

    config = CounterfactualConfig(
        data=dataset,
        out=out,
        models=[f"{algorithm}={model}"],
        start_model=start_model,
        recommenders=list(recommenders),
        viewers=viewers,
        steps=steps,
        seed=seed,
        issue=subject,
    )
    return headline(run(config), subject)


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
