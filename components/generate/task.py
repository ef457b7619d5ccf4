"""What the generate task does: completions from a model server, scored, tracked."""

from __future__ import annotations

import json

from grail.core import tracking
from grail.core.errors import GrailError, reported

PROMPT_SETTINGS = ("summary_mode", "summary_budget", "max_new_tokens")


def prompt_settings(prompt: str) -> dict:
    """The generate component's `prompt` JSON as settings of the stage, refused in one line
    when it is not an object of the settings it knows.

    >>> prompt_settings('{"summary_mode": "abstractive", "summary_budget": 3000}')
    {'summary_mode': 'abstractive', 'summary_budget': 3000}
    """
    try:
        given = json.loads(prompt or "{}")
    except json.JSONDecodeError as err:
        raise GrailError(f"prompt: not JSON ({err.msg})") from None
    if not isinstance(given, dict) or set(given) - set(PROMPT_SETTINGS):
        raise GrailError(f"prompt: expected a JSON object of {list(PROMPT_SETTINGS)}, got {prompt}")
    return given


@reported("generate")
def generate_task(
    dataset: str,
    model: str,
    num_generations: int,
    limit: int,
    parent: str,
    out: str,
    prompt: str = "{}",
) -> dict:
    from grail.generate.stage import run

    settings = prompt_settings(prompt)
    params = {"model": model, "num_generations": num_generations, "limit": limit, **settings}
    with tracking.stage_run(parent, "generate", params) as run_id:
        summary = run(
            dataset,
            out,
            model,
            num_generations=num_generations,
            limit=limit or None,
            **settings,
        )
        tracking.log_metrics(
            run_id, {k: summary[k] for k in ("generated", "failures", "acceptance_rate")}
        )
    return summary


def run_generate(
    *,
    dataset,
    model: str,
    num_generations: int,
    limit: int,
    parent_run: str,
    generated,
    metrics,
    prompt: str = "{}",
) -> None:
    """The generate component's body: :func:`generate_task` into the `generated` artifact,
    its counts into `metrics`."""
    summary = generate_task(
        dataset.path, model, num_generations, limit, parent_run, generated.path, prompt
    )
    for name in ("generated", "failures", "acceptance_rate", "parse_rate"):
        metrics.log_metric(name, summary[name])
