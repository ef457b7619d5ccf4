"""Checkpoints to object storage after every save, and resume from the newest complete one.

:class:`CheckpointUploadCallback` snapshots ``output_dir/checkpoint-N`` with hard links (instant,
and immune to ``save_total_limit`` rotation) and uploads it in a background thread to
``checkpoint_uri/checkpoint-N/``, writing ``_COMPLETE.json`` last. Training only waits when the
next save comes while the previous upload is still running, and at the end of training: never
longer than the upload itself. :func:`resolve_latest` picks the newest checkpoint whose marker
exists and whose files are all there, so a half-uploaded checkpoint is never chosen.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from transformers import TrainerCallback

from grail.storage import (
    Location,
    download_folder,
    list_files,
    read_text,
    upload_folder,
    write_text,
)

logger = logging.getLogger(__name__)
MARKER = "_COMPLETE.json"
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def _snapshot(folder: Path, staging: Path) -> Path:
    """Hard-link copy of a checkpoint folder (falls back to a real copy across filesystems)."""
    target = staging / folder.name
    shutil.rmtree(target, ignore_errors=True)
    try:
        shutil.copytree(folder, target, copy_function=os.link)
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(folder, target)
    return target


class CheckpointUploadCallback(TrainerCallback):
    """Upload every saved checkpoint to `uri` without blocking training on the transfer."""

    def __init__(self, uri: str):
        self.location = Location.parse(uri)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-upload")
        self._pending: Future | None = None
        self.uploaded: list[str] = []

    def _wait(self) -> None:
        if self._pending is not None:
            self._pending.result()  # re-raises an upload error in the training process
            self._pending = None

    def _upload(self, snapshot: Path, step: int) -> None:
        target = self.location.child(snapshot.name)
        names = upload_folder(snapshot, target)
        sizes = {name: (snapshot / name).stat().st_size for name in names}
        write_text(target.child(MARKER), json.dumps({"global_step": step, "files": sizes}))
        shutil.rmtree(snapshot, ignore_errors=True)
        self.uploaded.append(str(target))
        logger.info("uploaded %s (%d files)", target, len(names))

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self._wait()
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        snapshot = _snapshot(folder, Path(args.output_dir) / ".upload-staging")
        self._pending = self._executor.submit(self._upload, snapshot, state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self._wait()


def complete_checkpoints(uri: str) -> dict[int, str]:
    """Global step -> name of every fully uploaded checkpoint under `uri`."""
    location = Location.parse(uri)
    files = list_files(location)
    found = {}
    for name in {key.split("/", 1)[0] for key in files}:
        match = CHECKPOINT.match(name)
        if not match or f"{name}/{MARKER}" not in files:
            continue
        listed = json.loads(read_text(location.child(f"{name}/{MARKER}")))["files"]
        if all(files.get(f"{name}/{file}") == size for file, size in listed.items()):
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
