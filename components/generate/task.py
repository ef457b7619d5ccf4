"""What the generate task does: completions from a model server, scored, tracked."""

from __future__ import annotations

from grail.core import tracking
from grail.core.errors import reported


@reported("generate")
def generate_task(
    dataset: str, model: str, num_generations: int, limit: int, parent: str, out: str
) -> dict:
    from grail.generate.stage import run

    params = {"model": model, "num_generations": num_generations, "limit": limit}
    with tracking.stage_run(parent, "generate", params) as run_id:
        summary = run(dataset, out, model, num_generations=num_generations, limit=limit or None)
        tracking.log_metrics(
            run_id, {k: summary[k] for k in ("generated", "failures", "acceptance_rate")}
        )
    return summary


def run_generate(
    *, dataset, model: str, num_generations: int, limit: int, parent_run: str, generated, metrics
) -> None:
    """The generate component's body: :func:`generate_task` into the `generated` artifact,
    its counts into `metrics`."""
    summary = generate_task(dataset.path, model, num_generations, limit, parent_run, generated.path)
    for name in ("generated", "failures", "acceptance_rate", "parse_rate"):
        metrics.log_metric(name, summary[name])
