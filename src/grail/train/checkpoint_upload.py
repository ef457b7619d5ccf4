"""The training callback that uploads every saved checkpoint to ``checkpoint_uri`` without
blocking training on the transfer (:mod:`grail.core.checkpoints` says how and where).

Each node's first process uploads what its node saved (on several nodes, each node holds its
own ZeRO-3 shards), with that node's marker. Saves are snapshotted with hard links and queued:
a slow upload never holds a process inside a save while the others wait for it in ZeRO-3's
collectives; :meth:`CheckpointUploadCallback.finish`, called once training's collectives are
over, waits for the queue.
"""

from __future__ import annotations

import logging
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from transformers import TrainerCallback

from grail.core.checkpoints import UPLOAD_STAGING, upload_complete
from grail.core.lease import check_still_held
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


def node_of(process_index: int, world_size: int) -> tuple[int, int]:
    """(this node, nodes) from the process index and the processes per node that torchrun
    (under accelerate) sets as ``LOCAL_WORLD_SIZE``.

    >>> node_of(5, 8), node_of(0, 1)
    ((0, 1), (0, 1))
    """
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size)) or 1
    return process_index // per_node, max(world_size // per_node, 1)


class CheckpointUploadCallback(TrainerCallback):
    """Upload every saved checkpoint to `uri` without blocking training on the transfer."""

    def __init__(self, uri: str):
        self.location = Location.parse(uri)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-upload")
        self._pending: list[Future] = []
        self.uploaded: list[str] = []

    def _raise_failed(self) -> None:
        """Re-raise, in the training process, an upload that has failed already."""
        for future in [f for f in self._pending if f.done()]:
            self._pending.remove(future)
            future.result()

    def _upload(self, snapshot: Path, step: int, node: int, nodes: int) -> None:
        target = self.location.child(snapshot.name)
        names = upload_complete(snapshot, target, step, node, nodes)
        shutil.rmtree(snapshot, ignore_errors=True)
        self.uploaded.append(str(target))
        logger.info("uploaded %s (%d files, node %d of %d)", target, len(names), node + 1, nodes)

    def on_save(self, args, state, control, **kwargs):
        if not state.is_local_process_zero:
            return
        self._raise_failed()
        check_still_held(str(self.location))  # never write over another training's checkpoints
        node, nodes = node_of(args.process_index, args.world_size)
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        snapshot = _snapshot(folder, Path(args.output_dir) / UPLOAD_STAGING)
        future = self._executor.submit(self._upload, snapshot, state.global_step, node, nodes)
        self._pending.append(future)

    def finish(self) -> None:
        """Wait for every queued upload (re-raising a failed one)."""
        while self._pending:
            self._pending.pop(0).result()
