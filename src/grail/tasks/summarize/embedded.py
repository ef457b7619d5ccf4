"""The summarize task's embedded default (``grail run --local --task summarize``): the tiny
summarizer's recipe, GRPO for the recipe's steps, a synthetic study of ``--documents``."""

from __future__ import annotations

DEFAULTS = {
    "recipe": "recipes/tiny/config_summarize.yaml",
    "algorithms": ["grpo"],
    "max_steps": None,  # the recipe's own steps and saves
    "mlflow_experiment": "grail-local-summarize",
    "folder": "summarize-",  # the local run's folder: grail-summarize-ALGORITHMS-RUN
}


def arguments(config) -> dict:
    """The summarize DAG's own arguments of a local run: the document study's size and split."""
    return {"documents": config.documents, "validation_documents": config.validation_documents}
