"""The synthetic study's settings (``grail simulate``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grail.core.config import option
from grail.core.errors import GrailError


@dataclass(kw_only=True)
class SimulateConfig:
    """grail simulate: a synthetic study in the raw export format."""

    out: str = option("Folder to write the raw export into.")
    participants: int | None = option(
        "Participants over the three studies (default: as the real study, 6044).", None
    )
    seed: int = option("Random seed (same seed, same bytes).", 7)
    layout: Literal["grail", "capsule"] = option(
        "grail's own raw layout, or the published CodeOcean capsule's (folders, file names, "
        "survey columns and inclusion rules).",
        "grail",
    )

    def __post_init__(self):
        if self.participants is not None and self.participants < 1:
            raise GrailError(f"participants: expected at least 1, got {self.participants}")
