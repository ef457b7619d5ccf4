"""What a person reads of the slate task's benchmark: its Markdown report and SVG charts.

The benchmark (:mod:`grail.tasks.slate.benchmark.run`) computes and hands its result dict
here; every table is written by :func:`table`, every chart saved by
:func:`grail.core.charts.save_svg` (text kept as text, stable ids: the same input gives the
same file).
"""

from __future__ import annotations

import json
from pathlib import Path

from grail.core.charts import pyplot, save_svg
from grail.core.markdown import ci, section, table
from grail.tasks.slate.baselines import BLIND_CEILING, EXPECTED_CEILING, ORACLE
from grail.tasks.slate.benchmark.reads import ABLATIONS

# The benchmark (report.md, accuracy_by_model.svg, accuracy_vs_step.svg)

CEILING_NOTE = (
    f"`{EXPECTED_CEILING}` and `{BLIND_CEILING}` are expectations from the study's choice "
    "model (the viewer's hidden stance known; positions hidden for the blind one), not "
    f"bounds: on a sample a predictor can beat them by luck. `{ORACLE}` is that model's "
    "most likely pick scored as a predictor."
)


def benchmark_markdown(result: dict) -> str:
    """``report.md`` of :func:`grail.tasks.slate.benchmark.run.run`: the tables a person
    reads."""
    systems = result["systems"]
    lines = [f"# Benchmark: {result['data']} ({result['split']}, {result['rows']} rows)"]
    lines += unparsed_start(systems)
    ranked = sorted(systems.items(), key=lambda item: -item[1]["accuracy"])
    lines += section(
        "Next-video accuracy (95% participant-bootstrap intervals)",
        *table(
            ["system", "kind", "accuracy [95% CI]", "parse rate", "n"],
            [[n, s["kind"], ci(s), f"{s['parse_rate']:.3f}", s["n"]] for n, s in ranked],
            right=2,
        ),
    )
    if EXPECTED_CEILING in systems:
        lines += ["", CEILING_NOTE]
    prompts = [
        [n, f"`{json.dumps(s['prompt'], sort_keys=True)}`"]
        for n, s in systems.items()
        if s.get("prompt")
    ]
    if prompts:
        lines += section("How each model was asked", *table(["model", "prompt"], prompts))
    lines += _simulator(result) + _reads(systems)
    lines += _by_group(systems) + _positions(systems) + _by_step(systems)
    lines += _opinion(result["opinion"]) + _win_rates(result["win_rates"])
    if result["skipped"]:
        lines += section("Skipped", *(f"- {k}: {v}" for k, v in result["skipped"].items()))
    return "\n".join(lines) + "\n"


LOW_PARSE_RATE = 0.5  # below it, most of a model's sampled replies earn no reward at all


def unparsed_start(systems: dict) -> list[str]:
    """A warning for each model whose step 0 answered in the format less than half the time:
    GRPO from it starts with rewards that are mostly 0 for every completion (nothing to learn).

    >>> unparsed_start({"m@0": {"kind": "model", "step": 0, "parse_rate": 0.1}})[1]
    '> **Warning**: m@0 (step 0) gave a parsable answer in 10% of the rows: below 50%, GRPO from it starts where most completions score 0 and there is little to learn; warm it up on the format first (sft_dataset).'
    """  # noqa: E501 (the line as written)
    low = [
        (name, s["parse_rate"])
        for name, s in systems.items()
        if s.get("kind") == "model"
        and s.get("step") == 0
        and s.get("parse_rate") is not None
        and s["parse_rate"] < LOW_PARSE_RATE
    ]
    return [
        line
        for name, rate in low
        for line in (
            "",
            f"> **Warning**: {name} (step 0) gave a parsable answer in {rate:.0%} of the rows: "
            f"below {LOW_PARSE_RATE:.0%}, GRPO from it starts where most completions score 0 "
            "and there is little to learn; warm it up on the format first (sft_dataset).",
        )
    ]


def reads_cell(entry: dict, name: str) -> str:
    """One ablation's difference and interval, e.g. ``+0.080 [+0.050, +0.110]``; ``–`` when
    the system was not asked.

    >>> reads_cell({"reads_viewer": 0.08, "reads_viewer_ci_low": 0.05,
    ...             "reads_viewer_ci_high": 0.11}, "viewer")
    '+0.080 [+0.050, +0.110]'
    """
    key = f"reads_{name}"
    if entry.get(key) is None:
        return "–"
    return f"{entry[key]:+.3f} [{entry[f'{key}_ci_low']:+.3f}, {entry[f'{key}_ci_high']:+.3f}]"


def _reads(systems: dict) -> list[str]:
    """Whether each model (and the ranker) reads: log-loss with the viewer's lines, then the
    options, swapped for another row's, minus as shown."""
    asked = [(n, s) for n, s in systems.items() if any(f"reads_{a}" in s for a in ABLATIONS)]
    if not asked:
        return []
    rows = [[n, s["kind"], *(reads_cell(s, a) for a in ABLATIONS)] for n, s in asked]
    counts = sorted({s.get(f"reads_{a}_rows") for _, s in asked for a in ABLATIONS} - {None})
    return section(
        "Does it read? (higher: it reads)",
        f"Log-loss on the same rows (the first {', '.join(map(str, counts))}) with the "
        "viewer's lines (profile, initial viewpoint, survey highlights) swapped for another "
        "participant's, and with the options' text swapped for another slate's of the same "
        "size (positions and the chosen position kept), minus log-loss as shown; paired, "
        "95% participant-bootstrap intervals. A system that reads gets worse (above 0); one "
        "that sits on the position prior stays put (0).",
        "",
        *table(["system", "kind", "viewer swapped", "options swapped"], rows),
    )


def _by_group(systems: dict) -> list[str]:
    groups = sorted({g for s in systems.values() for g in s["by_group"]})
    rows = [
        [name] + [ci(s["by_group"][g]) if g in s["by_group"] else "" for g in groups]
        for name, s in systems.items()
    ]
    return section("By issue and study", *table(["system", *groups], rows))


def _positions(systems: dict) -> list[str]:
    positions = sorted(
        {p for s in systems.values() for p in s.get("positions", {})},
        key=lambda p: (p == "none", p),
    )
    rows = [
        [name] + [s["positions"].get(p, 0) for p in positions]
        for name, s in systems.items()
        if "positions" in s
    ]
    return section(
        "Predicted positions", *table(["system", *positions], rows, right=len(positions))
    )


def _by_step(systems: dict) -> list[str]:
    steps = [(s["series"], s["step"], name) for name, s in systems.items() if "step" in s]
    if not steps:
        return []
    rows = [
        [series or name, step, ci(systems[name]), _metric(systems[name], "log_loss")]
        + [f"{systems[name]['parse_rate']:.3f}", systems[name].get("collapsed", "")]
        for series, step, name in sorted(steps, key=lambda x: (str(x[0]), x[1] or 0))
    ]
    columns = ["run", "step", "accuracy [95% CI]", "log-loss [95% CI]", "parse rate", "collapse"]
    return section(
        "By training step (step 0: the starting model)",
        *_align(table(columns, rows), "|---|---:|---|---|---:|---|"),
    )


def _metric(entry: dict, key: str) -> str:
    if entry.get(key) is None:
        return "–"
    ci = entry.get(f"{key}_ci")
    return f"{entry[key]:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


SIMULATOR_COLUMNS = (
    "log_loss",
    "calibrated_log_loss",
    "expected_log_loss",
    "brier",
    "ece",
    "position_tv",
    "slant_tv",
    "score_vs_prior",
    "score_vs_uniform",
)


def _simulator(result: dict) -> list[str]:
    """The simulator scores of every system that has a choice distribution."""
    systems = result["systems"]
    scored = [(n, s) for n, s in systems.items() if s.get("log_loss") is not None]
    if not scored:
        return []
    shown = [c for c in SIMULATOR_COLUMNS if any(s.get(c) is not None for _, s in scored)]
    rows = [
        [name, s["kind"]] + [_metric(s, c) for c in shown] + [s.get("collapsed", "")]
        for name, s in sorted(scored, key=lambda item: item[1]["log_loss"])
    ]
    methods = [f"- {n}: {s['method']}" for n, s in systems.items() if s.get("method")]
    return section(
        "As a simulator of people (lower is better)",
        f"Intervals: {result.get('intervals', '95% participant bootstrap')}. `log_loss`: "
        "-log P(the chosen video); `calibrated_log_loss`: the same after one temperature "
        "per system, cross-fitted over two halves of the participants (what is left is the "
        "ranking's cost; the gap to `log_loss`, the calibration's); `expected_log_loss` "
        "(synthetic studies): the log-loss "
        "expected under the study's known choice probabilities of each row, the same quantity "
        "without the noise of which option each person happened to click (minus the ceiling's, "
        "the divergence from the true choice model); `brier`: squared error of the choice "
        "distribution; `ece`: calibration error over every option; `position_tv` / "
        "`slant_tv`: total variation between the simulated and the real shares of chosen "
        "positions / of chosen slants "
        f"relative to the viewer. `{EXPECTED_CEILING}`: the choice model's exact expected "
        "log-loss and Brier (the best any simulator can do). `score_vs_prior` / "
        "`score_vs_uniform` (synthetic studies; higher is better): the share of the gap from "
        "always-first / from uniform to that ceiling a system closes, in percent of expected "
        "log-loss (100: the ceiling, 0: the reference, below 0: worse than it; SimBench's "
        "normalisation).",
        "",
        *table(["system", "kind", *shown, "collapse"], rows),
        *(["", "How each model's choice distribution was read:", *methods] if methods else []),
    ) + _differences(result.get("differences") or {}, result.get("chosen"))


def exported_section(chosen: dict | None) -> list[str]:
    """Which checkpoint the pipeline's export takes, by what rule, and why
    (:mod:`grail.core.selection`)."""
    if not chosen:
        return []
    return section(
        "The checkpoint exported",
        f"Step {chosen['step']} of {chosen['last_step']}: {chosen['reason']} (the rule: "
        f"{chosen['rule']}). Chosen on these rows, so its score here favours it a little; the "
        "interval keeps noise from being taken for a better model.",
    )


def _differences(differences: dict, chosen: dict | None = None) -> list[str]:
    """The paired differences' section, then the checkpoint exported (:func:`exported_section`)."""
    rows = [
        [label.replace("_", " "), d["against"], metric]
        + [f"{d['difference']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]"]
        for label, entry in differences.items()
        for metric, d in entry.items()
    ]
    if not rows:
        return exported_section(chosen)
    return section(
        "Did training help? (paired on the same rows, participant bootstrap)",
        *table(["difference", "against", "metric", "value [95% CI]"], rows),
        "",
        "First question: is the model better than always-first, the position prior (people "
        "click option 1 most), in log-loss? Accuracy: higher is better; log-loss: lower is "
        "better. An interval that excludes 0 is a difference the data supports.",
    ) + exported_section(chosen)


def _opinion(opinion: dict) -> list[str]:
    if not opinion:
        return []
    rows = [
        [name, f"{o['direction_accuracy']:.3f} [{o['ci_low']:.3f}, {o['ci_high']:.3f}]"]
        + [o["mae"], o["rmse"], o["parse_rate"], o["n"]]
        for name, o in opinion.items()
    ]
    columns = ["system", "direction accuracy [95% CI]", "MAE", "RMSE", "parse rate"]
    return section(
        "Opinion direction (one row per participant: their last evaluated step)",
        *table([*columns, "participants"], rows, right=4),
    )


def _win_rates(win_rates: dict) -> list[str]:
    refs = sorted({r for row in win_rates.values() for r in row})
    rows = [
        [name] + [f"{row[r]:.3f}" if r in row else "–" for r in refs]
        for name, row in win_rates.items()
    ]
    return section(
        "Win rates (row against column: 1 win, 0.5 tie, 0 loss per row)",
        *table(["system", *refs], rows, right=len(refs)),
    )


def _align(lines: list[str], rule: str) -> list[str]:
    """A table whose alignment is not a run of left then right columns."""
    return [lines[0], rule, *lines[2:]]


def chart_by_model(result: dict, path: Path) -> None:
    """Horizontal bars with 95% CI whiskers, one per system."""
    plt = pyplot()
    items = sorted(result["systems"].items(), key=lambda item: item[1]["accuracy"])
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(items) + 1.5))
    for y, (name, s) in enumerate(items):
        bar = ax.barh(
            y,
            s["accuracy"],
            color="#4c72b0" if s["kind"] == "model" else "#999999",
            xerr=[[s["accuracy"] - s["ci_low"]], [s["ci_high"] - s["accuracy"]]],
            capsize=3,
        )
        bar.patches[0].set_gid(f"series-{name}")
    ax.set_yticks(range(len(items)), [name for name, _ in items])
    ax.set_xlabel("next-video accuracy (95% participant-bootstrap interval)")
    ax.set_xlim(0, 1)
    ax.set_title(f"Accuracy by model: {_subject(result)}, {result['rows']} rows")
    save_svg(fig, path)


def _subject(result: dict) -> str:
    """What a chart is about: the branch (issue, algorithm) when the benchmark names one."""
    branch = result.get("branch")
    return f"{branch['issue']}, {branch['algorithm']}" if branch else result["split"]


def chart_by_step(result: dict, path: Path, metric: str = "accuracy") -> bool:
    """`metric` (accuracy or log_loss) against training step per training run, from step 0
    (the starting model), with its intervals and reference lines; False if there is no run."""
    series: dict[str, list] = {}
    for name, s in result["systems"].items():
        if s.get("step") is not None and s.get(metric) is not None:
            series.setdefault(s.get("series") or name, []).append(s)
    if not series:
        return False
    fig, ax = pyplot().subplots(figsize=(8, 5))
    for label, points in series.items():
        points.sort(key=lambda s: s["step"])
        low, high = _interval(points, metric)
        x, y = [p["step"] for p in points], [p[metric] for p in points]
        errors = [
            [v - lo for v, lo in zip(y, low, strict=True)],
            [h - v for v, h in zip(y, high, strict=True)],
        ]
        line = ax.errorbar(x, y, yerr=errors, marker="o", capsize=3, label=label, linewidth=2)
        line[0].set_gid(f"series-{label}")
    _reference_lines(ax, result["systems"], metric)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("training step (0: the starting model)")
    interval = "95% participant-bootstrap interval"
    if metric == "accuracy":
        ax.set_ylabel(f"next-video accuracy ({interval})")
        ax.set_ylim(0, 1)
    else:
        ax.set_ylabel("log-loss, lower is better (95% participant-bootstrap CI)")
    ax.set_title(f"{METRIC_TITLES[metric]} vs training step: {_subject(result)}")
    ax.legend(loc="best", fontsize=8)
    save_svg(fig, path)
    return True


METRIC_TITLES = {"accuracy": "Accuracy", "log_loss": "Log-loss"}


def _interval(points: list[dict], metric: str) -> tuple[list[float], list[float]]:
    if metric == "accuracy":
        return [p["ci_low"] for p in points], [p["ci_high"] for p in points]
    return [p[f"{metric}_ci"][0] for p in points], [p[f"{metric}_ci"][1] for p in points]


# Reference lines: each in its own style, so they read apart in grey print too.
REFERENCE_STYLES = {
    "random (expected)": {"linestyle": ":", "color": "#999999"},
    "always_first": {"linestyle": "-.", "color": "#555555"},
    "ranker": {"linestyle": "--", "color": "#8172b2"},
    EXPECTED_CEILING: {"linestyle": (0, (6, 2, 1, 2, 1, 2)), "color": "#c44e52", "linewidth": 1.5},
    BLIND_CEILING: {"linestyle": (0, (1, 1)), "color": "#c44e52"},
}


def _reference_lines(ax, systems: dict, metric: str = "accuracy") -> None:
    """Random, always-first, the ranker and the ceiling (the blind ceiling too when options
    were shuffled), each in a style of its own."""
    models = [s for s in systems.values() if s["kind"] == "model"]
    shuffled = any((s.get("prompt") or {}).get("shuffle_seed") is not None for s in models)
    shown = [n for n in REFERENCE_STYLES if n != BLIND_CEILING or shuffled]
    for name in shown:
        entry = systems.get(name)
        if entry is None or entry.get(metric) is None:
            continue
        style = {"linewidth": 1} | REFERENCE_STYLES[name]
        ax.axhline(entry[metric], label=name, **style).set_gid(f"reference-{name}")
