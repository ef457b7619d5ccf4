"""Stage ``clean``: a raw export -> the cleaned splits and the audit, each task by its own rules
(:func:`grail.tasks.slate.clean.clean_steps`: one row per step, split by participant;
:func:`grail.tasks.summarize.clean.clean_documents`: one row per document, split by document).

Run: ``grail clean --raw raw/ --out data/ [--task slate|summarize] [--validation-fraction 0.1]
[--seed 2024]``.
"""

from __future__ import annotations

from pathlib import Path

from grail.clean.config import CleanConfig
from grail.tasks import TASKS


def clean(raw: str | Path, out: str | Path, **options) -> dict:
    """Run the stage: read `raw`, write both splits and the audit under `out`; return the audit.
    `options`: the other :class:`CleanConfig` fields."""
    config = CleanConfig(raw=str(raw), out=str(out), **options)
    return TASKS[config.task].clean(raw, out, config)


def fingerprint(folder: Path) -> str:
    """A cleaned dataset's fingerprint (every task's): the first 16 hex digits of the SHA-256
    of its parquet files, in name order."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(Path(folder).glob("*.parquet")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
