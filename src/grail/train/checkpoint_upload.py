"""The training callback that uploads every saved checkpoint to ``checkpoint_uri`` without
blocking training on the transfer (:mod:`grail.core.checkpoints` says how and where)."""

from __future__ import annotations

import logging
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from transformers import TrainerCallback

from grail.core.checkpoints import upload_complete
from grail.core.storage import Location

logger = logging.getLogger(__name__)


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
        names = upload_complete(snapshot, target, step)
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
