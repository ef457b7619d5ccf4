"""Checkpoints in object storage: each ``checkpoint_uri/checkpoint-N/`` uploaded whole, its
``_COMPLETE.json`` marker last (training's uploader:
:class:`grail.train.checkpoint_upload.CheckpointUploadCallback`, which snapshots every save with
hard links and uploads it in a background thread). :func:`resolve_latest` picks the newest
checkpoint whose marker exists and whose files are all there, so a half-uploaded checkpoint is
never chosen; the final model goes to ``checkpoint_uri/final`` the same way.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

from grail.core.outputs import MARKER
from grail.core.storage import (
    Location,
    download_folder,
    list_files,
    read_text,
    upload_folder,
    write_text,
)

logger = logging.getLogger(__name__)
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


FINAL = "final"  # the final model below checkpoint_uri, when training uploads it


def upload_complete(folder: Path, target: Location, step: int) -> list[str]:
    """Upload `folder`'s files to `target`, then the marker listing them (the last object: a
    reader that finds it finds every file)."""
    names = [n for n in upload_folder(folder, target) if n != MARKER]
    sizes = {name: (folder / name).stat().st_size for name in names}
    write_text(target.child(MARKER), json.dumps({"global_step": step, "files": sizes}))
    return names


def is_complete(location: Location, files: dict[str, int] | None = None) -> bool:
    """Whether the marker below `location` exists and every file it lists has its size."""
    files = list_files(location) if files is None else files
    if MARKER not in files:
        return False
    listed = json.loads(read_text(location.child(MARKER)))["files"]
    return all(files.get(name) == size for name, size in listed.items())


def upload_final(output_dir: str | Path, uri: str, step: int) -> None:
    """The final model (the top-level files of `output_dir`, not its checkpoints) to
    ``uri/final``."""
    staging = Path(output_dir) / ".upload-staging" / FINAL
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for path in Path(output_dir).iterdir():
        if path.is_file() and path.name != MARKER:
            os.link(path, staging / path.name)
    target = Location.parse(uri).child(FINAL)
    upload_complete(staging, target, step)
    shutil.rmtree(staging, ignore_errors=True)
    logger.info("uploaded the final model to %s", target)


def download_final(uri: str, out: str | Path) -> bool:
    """Download ``uri/final`` into `out` when it is complete; False when it is not there."""
    location = Location.parse(uri).child(FINAL)
    if not is_complete(location):
        return False
    download_folder(location, Path(out))
    return True


def complete_checkpoints(uri: str) -> dict[int, str]:
    """Global step -> name of every fully uploaded checkpoint under `uri`."""
    location = Location.parse(uri)
    files = list_files(location)
    found = {}
    for name in {key.split("/", 1)[0] for key in files}:
        match = CHECKPOINT.match(name)
        inner = {k.split("/", 1)[1]: v for k, v in files.items() if k.startswith(f"{name}/")}
        if match and is_complete(location.child(name), inner):
            found[int(match.group(1))] = name
    return found


def resolve_latest(uri: str) -> str | None:
    """Name of the newest complete checkpoint under `uri`, or None when there is none."""
    found = complete_checkpoints(uri)
    return found[max(found)] if found else None


def download_latest(uri: str, output_dir: str | Path) -> Path | None:
    """Download the newest complete checkpoint into `output_dir`; None when there is none."""
    name = resolve_latest(uri)
    if name is None:
        return None
    target = Path(output_dir) / name
    shutil.rmtree(target, ignore_errors=True)
    download_folder(Location.parse(uri).child(name), target)
    (target / MARKER).unlink(missing_ok=True)
    return target


def resume_path(
    resume_from_checkpoint: str | None, checkpoint_uri: str | None, output_dir: str
) -> str | None:
    """What to pass to ``trainer.train(resume_from_checkpoint=...)``.

    ``latest`` means the newest complete checkpoint under ``checkpoint_uri`` (downloaded), else
    the newest in ``output_dir``, else a fresh start. Any other value is used as given.
    """
    if resume_from_checkpoint != "latest":
        return resume_from_checkpoint
    if checkpoint_uri:
        local = download_latest(checkpoint_uri, output_dir)
        if local is not None:
            logger.info("resuming from %s/%s", checkpoint_uri, local.name)
            return str(local)
    from transformers.trainer_utils import get_last_checkpoint

    if Path(output_dir).is_dir() and get_last_checkpoint(output_dir):
        return get_last_checkpoint(output_dir)
    logger.info("no checkpoint to resume from: starting fresh")
    return None
