"""The synthetic study's settings (``grail simulate``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grail.core.config import option
from grail.core.errors import GrailError
from grail.tasks import Task

MOST_PARTICIPANTS = 1_000_000  # the real study has 6,044; 2 cores write 20,000 in seconds
MOST_DOCUMENTS = 1_000_000


@dataclass(kw_only=True)
class SimulateConfig:
    """grail simulate: a synthetic study in its task's raw export layout (slate: the GRAIL
    study's; summarize: RepLiQA's)."""

    out: str = option("Folder to write the raw export into.")
    task: Task = option(
        "slate: the viewing study (raw export format); summarize: synthetic documents with "
        "hidden questions (RepLiQA's layout).",
        "slate",
    )
    documents: int = option("Documents (task summarize).", 600)
    participants: int | None = option(
        "Participants over the three studies (default: as the real study, 6044).", None
    )
    seed: int = option("Random seed (same seed, same bytes).", 7)
    choices: Literal["study", "side", "marker"] = option(
        "Task slate: how people choose. study: the study's choice model (the viewer's stance "
        "against each video's slant, momentum, popularity, position); side: the viewer's "
        "party against each video's side alone, no position effect; marker: every slate has "
        "one option whose title opens with 'Featured:', chosen with probability 0.9 wherever "
        "it stands. side and marker are rungs of the learnability ladder "
        "(bench/learnability.py).",
        "study",
    )
    layout: Literal["grail", "capsule"] = option(
        "grail's own raw layout, or the published CodeOcean capsule's (folders, file names, "
        "survey columns and inclusion rules).",
        "grail",
    )

    def __post_init__(self):
        if self.documents < 2:
            raise GrailError(f"documents: expected at least 2, got {self.documents}")
        if self.participants is not None and self.participants < 1:
            raise GrailError(f"participants: expected at least 1, got {self.participants}")
        for name, most in (("participants", MOST_PARTICIPANTS), ("documents", MOST_DOCUMENTS)):
            value = getattr(self, name)
            if value is not None and value > most:  # held in memory whole: minutes, then gone
                raise GrailError(f"{name}: at most {most:,} (the study is written in memory), "
                                 f"got {value:,}")  # fmt: skip
