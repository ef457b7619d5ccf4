"""``grail simulate``'s slate study: the synthetic study (:mod:`grail.tasks.slate.simulate`) in
grail's raw layout or the published capsule's (:mod:`grail.tasks.slate.capsule_study`)."""

from __future__ import annotations

from pathlib import Path

from grail.tasks.slate.capsule_study import simulate_capsule
from grail.tasks.slate.simulate import simulate


def write_study(
    out: str | Path,
    participants: int | None,
    documents: int,
    seed: int,
    layout: str,
    choices: str = "study",
) -> list[str]:
    """``grail simulate``'s slate study in grail's raw layout or the published capsule's
    (`documents` is the other task's), people choosing as `choices` says (the study's choice
    model, or a rung of the learnability ladder); returns what it wrote, a line per study."""
    write = simulate_capsule if layout == "capsule" else simulate
    # participants 0/None: the real size
    truth = write(out, participants=participants or None, seed=seed, choices=choices)
    rung = "" if choices == "study" else f", people choosing by the {choices} rung"
    lines = [f"wrote a synthetic study to {out} ({layout} layout{rung})"]
    for name, study in truth["studies"].items():
        kept = study.get("expected_participants_kept")
        lines.append(
            f"  {name} ({study['issue']}): {study['participants']} participants"
            + (f" ({kept} pass the capsule's inclusion rules)" if kept is not None else "")
            + f", Bayes-optimal accuracy {study['bayes_optimal_accuracy']:.3f}"
        )
    return lines
