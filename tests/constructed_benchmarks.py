"""Benchmark results (``metrics.json``) built by hand, with the figures a test needs: what the
promotion gate decides on (components/promote/tests, tests/test_registry.py)."""

from __future__ import annotations


def slate_benchmark(high: float, collapsed: str | None = None) -> dict:
    """A slate benchmark's metrics.json whose final model minus always-first has the paired
    log-loss interval [high - 0.03, high]."""
    trained = {"kind": "model", "step": 4, "accuracy": 0.44, "log_loss": 1.27}
    if collapsed:
        trained["collapsed"] = collapsed
    return {
        "task": "slate",
        "scored_as": "choices",
        "trained": "grpo-gun",
        "systems": {"grpo-gun": trained},
        "differences": {
            "final_minus_always_first": {
                "log_loss": {"difference": high - 0.015, "ci": [high - 0.03, high],
                             "n": 600, "participants": 155, "against": "always_first"}
            }
        },
    }  # fmt: skip


def summarize_benchmark(low: float) -> dict:
    """A summarize benchmark's metrics.json: the summarizer's share answered has the interval
    [low, low + 0.1]; the best baseline (lead_k) answers 0.6."""
    answered = {"mean": low + 0.05, "ci": [low, low + 0.1]}
    return {
        "task": "summarize",
        "scored_as": "documents",
        "trained": "grpo-documents",
        "systems": {
            "grpo-documents": {"kind": "model", "step": 8, "answered": answered},
            "lead_k": {"kind": "baseline", "answered": {"mean": 0.6, "ci": [0.55, 0.65]}},
            "random_k": {"kind": "baseline", "answered": {"mean": 0.3, "ci": [0.25, 0.35]}},
        },
        "differences": {},
    }
