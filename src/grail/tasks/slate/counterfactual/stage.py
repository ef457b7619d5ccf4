"""``grail counterfactual``: trained simulators drive sessions under recommenders they never saw,
scored against the synthetic study's known truth, and replay the slates people were shown,
scored against people's sessions (docs/counterfactual.md).

Reads a cleaned study. A synthetic one (its ``truth.json`` and ``truth_steps.csv`` beside the
splits): rebuilds the study's world from the seed ``truth.json`` records (and refuses when the
rebuilt catalogue is not the study's), samples validation viewers, rolls out every recommender
under every simulator (:mod:`grail.tasks.slate.counterfactual.rollout`). A real one (no
``truth.json``): the ``replayed`` arm alone, against people
(:mod:`grail.tasks.slate.counterfactual.people`). Writes ``counterfactual.json``, ``report.md``
and ``outcomes.svg`` under ``--out``. :func:`run` is the slate task's ``counterfactual`` part
(:data:`grail.tasks.PARTS`), which ``grail counterfactual`` calls.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import time
from pathlib import Path

import numpy as np

from grail.core.errors import GrailError
from grail.tasks.slate.counterfactual.config import (
    BASELINES,
    JUDGED,
    JUDGED_LEVELS,
    CounterfactualConfig,
)
from grail.tasks.slate.counterfactual.outcomes import (
    METRICS,
    TRUTH,
    closer_than,
    outcome_table,
    summarize,
)
from grail.tasks.slate.counterfactual.people import (
    JUDGED_ON_PEOPLE,
    OBSERVED,
    PEOPLE,
    REPLAYED,
    agreement,
    observed_study,
    observed_table,
    people_sessions,
    shown_slates,
)
from grail.tasks.slate.counterfactual.rollout import State, Study, Viewer, roll_out, truth_simulator

logger = logging.getLogger(__name__)


def load_study(data: Path) -> tuple[Study, dict]:
    """The study's world, rebuilt from the seed ``truth.json`` records; refuses a study whose
    catalogue the rebuilt world does not reproduce (another grail version's simulator)."""
    from grail.tasks.slate.world import make_world

    path = data / "truth.json"
    if not path.is_file():
        raise GrailError(
            f"{path}: no truth.json: counterfactual outcomes need the synthetic study's known "
            "choice model (grail simulate); a real study's counterfactuals have no truth"
        )
    truth = json.loads(path.read_text())
    if "video_slant" not in truth or "seed" not in truth:
        raise GrailError(f"{path}: field video_slant or seed missing (not a grail simulate study)")
    if truth.get("choices", "study") != "study":
        raise GrailError(
            f"{path}: field choices: counterfactual outcomes are known for the study's own "
            f"choice model, not the {truth['choices']} rung of the learnability ladder"
        )
    world = make_world(np.random.default_rng(truth["seed"]))
    slants = {v.id: v.slant for v in world.videos.values()}
    if slants != truth["video_slant"]:
        raise GrailError(
            f"{path}: field video_slant: the catalogue rebuilt from seed {truth['seed']} is not "
            "this study's (simulated by another grail version?)"
        )
    sizes = {int(k): float(v) for k, v in truth["nuisance"]["slate_sizes"].items()}
    study = Study(
        videos=world.videos,
        catalogue={issue: tuple(vs) for issue, vs in world.catalogue.items()},
        popularity_z=world.popularity_z,
        model=world.model,
        opinion_shift=world.rule.shift,
        slate_sizes=sizes,
    )
    return study, truth


def sample_viewers(rows: list[dict], stances: dict | None, count: int, seed: int) -> list[Viewer]:
    """`count` validation participants (all when fewer), each with their first session's
    start video and the hidden stance the truth records for it (`stances` None: a real study,
    stance unknown)."""
    first: dict[str, dict] = {}
    for row in rows:
        if row["step_index"] == 0 and (stances is None or (row["session_id"], 0) in stances):
            first.setdefault(row["participant_id"], row)
    if not first:
        known = "" if stances is None else " the truth file knows"
        raise GrailError(f"validation split: no session start (step 0){known}")
    ids = sorted(first)
    chosen = np.random.default_rng([seed, 2]).choice(len(ids), min(count, len(ids)), replace=False)
    return [
        Viewer(
            participant_id=ids[k],
            study=first[ids[k]]["study"],
            issue=first[ids[k]]["issue"],
            profile=first[ids[k]].get("viewer") or {},
            opinion_before=first[ids[k]].get("opinion_before"),
            stance=float("nan") if stances is None else stances[(first[ids[k]]["session_id"], 0)],
            start=first[ids[k]]["current_video"]["id"],
            session=first[ids[k]]["session_id"],
        )
        for k in sorted(chosen.tolist())
    ]


def contract_row(state: State, study: Study, step: int) -> dict:
    """A state as a cleaned row (what prompts and baselines read); what a counterfactual session
    cannot know (watch times) is left out."""

    def item(video_id: str) -> dict:
        v = study.videos[video_id]
        return {
            "id": v.id,
            "title": v.title,
            "channel": v.channel,
            "duration_seconds": v.duration,
            "views": v.views,
            "likes": v.likes,
            "comments": v.comments,
        }

    viewer = state.viewer
    return {
        "participant_id": viewer.participant_id,
        "session_id": f"counterfactual-{viewer.participant_id}",
        "study": viewer.study,
        "issue": viewer.issue,
        "step_index": step,
        "current_video": {k: item(state.current)[k] for k in ("id", "title", "channel")},
        "history": [
            {
                "id": v,
                "title": study.videos[v].title,
                "channel": study.videos[v].channel,
                "watch_seconds": None,
                "total_seconds": study.videos[v].duration,
            }
            for v in state.history
        ],  # fmt: skip
        "slate": [item(v) for v in state.slate],
        "n_options": len(state.slate),
        # the prompt builders carry a label through; a counterfactual step has none, and no
        # simulator reads this one
        "gold_index": 1,
        "gold_id": state.slate[0],
        "viewer": viewer.profile,
        "opinion_before": viewer.opinion_before,
    }


def baseline_simulator(name: str, train: list[dict], study: Study):
    """A baseline's choice distributions over counterfactual states."""
    from grail.tasks.slate.baselines import fit_ranker, position_frequencies, ranker_distributions

    scorer = fit_ranker(train) if name == "ranker" else None

    def distributions(states: list[State]) -> list[np.ndarray]:
        rows = [contract_row(s, study, len(s.history)) for s in states]
        if scorer is None:
            return [np.array(d) for d in position_frequencies(train, rows)]
        return [np.array(d) for d in ranker_distributions(scorer(rows), rows)]

    return distributions


def model_simulator(path: str, study: Study, config: CounterfactualConfig):
    """A local model's choice distributions, asked as the benchmark asks it (its prompt.json,
    options shuffled as it was trained; the option-token probabilities after ``<answer>``)."""
    from grail.core.serving import ModelSpec
    from grail.inference.local import answer_local
    from grail.tasks.slate.benchmark.systems import ask, prompt_for

    prompt = prompt_for(ModelSpec(Path(path).name, "local", path), {})

    def distributions(states: list[State]) -> list[np.ndarray]:
        rows = [contract_row(s, study, len(s.history)) for s in states]
        presented, conversations = ask(rows, prompt)
        answers = answer_local(
            path,
            conversations,
            [r["n_options"] for r in rows],
            prompt["max_new_tokens"],
            config.batch_size,
            config.backend,
            config.thought_samples,
        )
        out = []
        for row, shown, shares in zip(rows, presented, answers.distributions, strict=True):
            by_id = {item["id"]: p for item, p in zip(shown["slate"], shares, strict=True)}
            out.append(np.array([by_id[item["id"]] for item in row["slate"]]))
        return out

    return distributions


def model_names(config: CounterfactualConfig) -> dict[str, str]:
    """Simulator name -> model folder: step_0 (the start model), then each model by its given
    name or its folder's name."""
    named = {"step_0": config.start_model} if config.start_model else {}
    if config.start_model and not Path(config.start_model).is_dir():
        raise GrailError(f"start_model: {config.start_model}: no such model folder")
    for spec in config.models:
        name, _, path = spec.rpartition("=")
        name = name or Path(path).name
        if not Path(path).is_dir():
            raise GrailError(f"models: {path}: no such model folder")
        if name in named or name in (TRUTH, *BASELINES):
            raise GrailError(f"models: the name {name} is taken: give NAME=FOLDER")
        named[name] = path
    return named


def run(config: CounterfactualConfig) -> dict:
    """Roll out, score, write; returns the results (counterfactual.json). A study without
    ``truth.json`` (a real one) runs the ``replayed`` arm against people alone."""
    from grail.core.outputs import atomic_folder
    from grail.tasks.slate.benchmark.systems import load_truth
    from grail.tasks.slate.contract import read_dataset

    started = time.perf_counter()
    data = Path(config.data)
    rows = read_dataset(data).to_pylist()
    known = (data / "truth.json").is_file()
    if known:
        study, _ = load_study(data)
        study = dataclasses.replace(study, shown=shown_slates(rows))
        truth_steps = load_truth(data, None) or {}
        stances = {k: v["stance"] for k, v in truth_steps.items() if v.get("stance") is not None}
        recommenders = config.recommenders
    else:
        if not any(r["split"] == "validation" for r in rows):
            raise GrailError(f"{data}: no validation rows (not a cleaned study?)")
        study, stances, recommenders = observed_study(rows), None, [REPLAYED]
    validation = [
        r for r in rows
        if r["split"] == "validation" and (not config.issue or r["issue"] == config.issue)
    ]  # fmt: skip
    train = [r for r in rows if r["split"] == "train"]
    viewers = sample_viewers(validation, stances, config.viewers, config.seed)
    simulators = {TRUTH: truth_simulator(study)} if known else {}
    for name in config.baselines:
        simulators[name] = baseline_simulator(name, train, study)
    for name, path in model_names(config).items():
        simulators[name] = model_simulator(path, study, config)
    sessions = roll_out(study, viewers, recommenders, simulators, config.steps, config.seed)
    rolled = time.perf_counter() - started
    issues = {v.issue for v in viewers}
    catalogue = sum(len(study.catalogue[i]) for i in issues)
    models = [s for s in simulators if s not in (TRUTH, *BASELINES)]
    results: dict = {}
    if known:
        table = outcome_table(sessions, viewers, study)
        effects = [tuple(text.split("-", 1)) for text in config.effect]
        results = summarize(table, viewers, catalogue, effects, config.bootstrap, config.seed)
        results["verdicts"] = verdicts(table, viewers, catalogue, effects, list(simulators), config)
    if REPLAYED in recommenders:
        people = people_sessions(validation, viewers, config.steps)
        observed = observed_table(sessions, people, viewers, study)
        results["people"] = agreement(
            observed, viewers, catalogue, models,
            [b for b in BASELINES if b in simulators], config.bootstrap, config.seed,
        )  # fmt: skip
    results["settings"] = {
        "viewers": len(viewers),
        "steps": config.steps,
        "seed": config.seed,
        "known_truth": known,
        "recommenders": recommenders,
        "not_scored": [r for r in config.recommenders if r not in recommenders],
        "simulators": list(simulators),
        "issues": sorted(issues),
        "catalogue": catalogue,
        "rollout_seconds": round(rolled, 1),
        "seconds": round(time.perf_counter() - started, 1),
    }
    with atomic_folder(config.out, "counterfactual") as staging:
        (staging / "counterfactual.json").write_text(json.dumps(results, indent=1) + "\n")
        (staging / "report.md").write_text(report(results) + "\n")
        chart(results, staging / "outcomes.svg")
    return results


def verdicts(table, viewers, catalogue, effects, simulators, config) -> list[dict]:
    """For each trained model and baseline (and the ranker against the position prior, the
    reference a judged outcome must separate): is the model's predicted effect of each effect
    on the clicked slant and on the opinion shift closer to the truth than the baseline's? And
    its like-minded click share on balanced slates (:data:`JUDGED_LEVELS`, the recommenders
    rolled out)? Not a one-sided recommender's like-minded share, or an effect on it: a
    like-minded recommender shows nothing else, so every simulator gets it right."""
    judged = [(effect, metric) for effect in effects for metric in JUDGED] + [
        ((recommender, None), metric)
        for recommender, metric in JUDGED_LEVELS
        if recommender in config.recommenders
    ]
    found = []
    models = [s for s in simulators if s not in (TRUTH, *BASELINES)]
    pairs = list(itertools.product(models, [b for b in BASELINES if b in simulators]))
    if set(BASELINES) <= set(simulators):  # the reference: does the ranker beat the prior?
        pairs.append(BASELINES[::-1])
    for (effect, metric), (model, baseline) in itertools.product(judged, pairs):
        gap = closer_than(
            table, viewers, catalogue, effect, metric, model, baseline, config.bootstrap,
            config.seed,
        )  # fmt: skip
        name = "-".join(effect) if effect[1] else effect[0]
        found.append({"effect": name, "metric": metric, "model": model, "baseline": baseline} | gap)
    return found


def report(results: dict) -> str:
    settings = results["settings"]
    known = settings["known_truth"]
    lines = [
        "# Counterfactual sessions",
        "",
        f"{settings['viewers']} validation viewers ({', '.join(settings['issues'])}), "
        f"{settings['steps']} clicks a session, seed {settings['seed']}; every simulator and "
        "recommender shares each viewer's random numbers (docs/counterfactual.md).",
    ]
    if known:
        lines += truth_sections(results)
    else:
        lines += [
            "",
            "This study has no known choice model (no truth.json: a real study). What its "
            "participants would have clicked under another recommender was never observed, so "
            "no recommender's outcome and no recommender effect can be scored here"
            + (f" (not rolled out: {', '.join(settings['not_scored'])})" if settings["not_scored"]
               else "")
            + "; nor can any outcome that needs a video's slant (the like-minded share, the "
            "slant, the opinion shift). What is scored is the factual arm: the slates people "
            "were shown, replayed, against the sessions people had.",
        ]  # fmt: skip
    if "people" in results:
        lines += people_sections(results["people"], settings)
    return "\n".join(lines)


def truth_sections(results: dict) -> list[str]:
    """The synthetic study's sections: each outcome by recommender, truth beside each
    simulator; the effects; the verdicts in words."""
    from grail.core.markdown import section, table

    settings = results["settings"]
    simulators = settings["simulators"]
    lines = []
    for metric in METRICS:
        rows = []
        for recommender in settings["recommenders"]:
            row = [recommender]
            for simulator in simulators:
                value = results["cells"][f"{recommender}/{simulator}/{metric}"]["value"]
                row.append(f"{value:+.3f}" if metric != "reach" else f"{value:.3f}")
            rows.append(row)
        lines += section(
            f"{metric} by recommender",
            *table(["recommender", *simulators], rows, right=len(simulators)),
        )
    effect_rows = []
    for key, entry in results["effects"].items():
        effect, simulator, metric = key.split("/")
        if metric not in JUDGED:  # the other outcomes' effects: counterfactual.json
            continue
        error = (
            f"{entry['error']:+.3f} [{entry['error_ci'][0]:+.3f}, {entry['error_ci'][1]:+.3f}]"
            if "error" in entry
            else "(the truth)"
        )
        effect_rows.append(
            [effect, metric, simulator,
             f"{entry['effect']:+.3f} [{entry['ci'][0]:+.3f}, {entry['ci'][1]:+.3f}]", error]
        )  # fmt: skip
    lines += section(
        "Recommender effects on the judged outcomes: predicted and true",
        *table(["effect", "metric", "simulator", "effect [95% CI]", "error vs truth [95% CI]"],
               effect_rows, right=2),
    )  # fmt: skip
    words = [
        f"- {v['model']}, {v['effect']}{'' if '-' in v['effect'] else ' slates'} on "
        f"{v['metric']}: {said(v)}"
        for v in results["verdicts"]
    ]
    lines += section(
        "Does training help predict the recommenders' effect, and what viewers click on "
        "balanced slates?",
        *(words or ["(no trained model)"]),
    )
    return lines


def said(verdict: dict, reference: str = "the truth") -> str:
    """A verdict's gap (|model error| minus |baseline error|) in words, with its interval."""
    low, high = verdict["ci"]
    baseline = verdict["baseline"]
    if high < 0:
        words = f"closer to {reference} than {baseline}"
    elif low > 0:
        words = f"further from {reference} than {baseline}"
    else:
        words = f"not distinguishable from {baseline} (the interval includes zero)"
    return f"{words} (|error| gap {verdict['gap']:+.3f} [{low:+.3f}, {high:+.3f}])"


def people_sections(people: dict, settings: dict) -> list[str]:
    """The factual arm against people: each simulator's outcomes on the replayed slates beside
    people's, the differences, and whether each model is closer to people than each
    baseline."""
    from grail.core.markdown import section, table

    simulators = [PEOPLE, *settings["simulators"]]
    rows = []
    for metric in OBSERVED:
        row = [metric]
        for name in simulators:
            value = people["cells"][f"{name}/{metric}"]["value"]
            entry = people["differences"].get(f"{name}/{metric}", {})
            shown = "n/a" if value is None else f"{value:.3f}"
            if entry.get("difference") is not None:
                shown += f" ({entry['difference']:+.3f}"
                if entry.get("ci"):
                    shown += f" [{entry['ci'][0]:+.3f}, {entry['ci'][1]:+.3f}]"
                shown += ")"
            row.append(shown)
        rows.append(row)
    rows.append(["clicks", *(str(people["clicks"][name]) for name in simulators)])
    words = [f"- {v['model']} on {v['metric']}: {said(v, 'people')}" for v in people["verdicts"]]
    return section(
        "The factual arm against people",
        f"The slates people were shown after each video, replayed as shown (`{REPLAYED}`), "
        "from each viewer's own start video; each simulated session cut to at most as many "
        "clicks as the viewer's own first session had. Each cell: the outcome, averaged over "
        "viewers (its difference from people over the viewers both have a value for [95% CI]; "
        "reach's without an interval, docs/counterfactual.md#the-factual-arm-against-people).",
        "",
        *table(["outcome", *simulators], rows, right=len(simulators)),
        "",
        "Is each model (step 0 and the trained ones) closer to people than the baselines? "
        f"(judged on {', '.join(JUDGED_ON_PEOPLE)}; a gap of absolute differences, one "
        "interval per line, no correction for the number of lines)",
        "",
        *(words or ["(no model)"]),
    )


def chart(results: dict, path: Path) -> None:
    """By recommender, the like-minded share and the opinion shift, truth beside each
    simulator (a synthetic study); the factual arm's outcomes, people beside each simulator."""
    from grail.core.charts import pyplot, save_svg

    plt = pyplot()
    settings = results["settings"]
    simulators, recommenders = settings["simulators"], settings["recommenders"]
    panels = ["like_minded", "opinion_shift"] if settings["known_truth"] else []
    panels += ["first_slot", "popularity"] if "people" in results else []
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    for ax, metric in zip(axes[0], panels, strict=True):
        if metric in OBSERVED:
            names = [PEOPLE, *simulators]
            values = [results["people"]["cells"][f"{n}/{metric}"]["value"] for n in names]
            values = [np.nan if v is None else v for v in values]
            colours = ["gray", *(f"C{k}" for k in range(len(simulators)))]  # as the legends
            ax.bar(np.arange(len(names)), values, 0.7, color=colours)
            ax.set_xticks(np.arange(len(names)), names, fontsize=8, rotation=20)
            ax.set_title(f"{metric.replace('_', ' ')}: {REPLAYED} arm, people first")
            continue
        width = 0.8 / len(simulators)
        for k, simulator in enumerate(simulators):
            values = [results["cells"][f"{r}/{simulator}/{metric}"]["value"] for r in recommenders]
            ax.bar(np.arange(len(recommenders)) + k * width, values, width, label=simulator)
        ax.set_xticks(np.arange(len(recommenders)) + 0.4 - width / 2, recommenders, fontsize=8)
        ax.set_title(metric.replace("_", " "))
        ax.legend(fontsize=7)
    save_svg(fig, path)
