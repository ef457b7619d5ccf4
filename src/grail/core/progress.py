"""Progress lines for the long steps of a command (building a model, generating completions).

The stages log to the ``grail`` logger; :func:`show_progress` (called by the ``grail`` command)
prints those lines on stderr with the time of day. Within a pipeline task they go to the task's
log. :class:`Progress` writes a line when a step starts, then at most one every ``every``
seconds, and one when it ends, so a step of a few seconds prints two lines and a long one shows
it is alive.
"""

from __future__ import annotations

import logging
import sys
import time

logger = logging.getLogger("grail")


class _Lines(logging.StreamHandler):
    """Writes to `stream`, or to whatever ``sys.stderr`` is when a line is written."""

    def __init__(self, stream=None):
        super().__init__(stream)
        self.fixed = stream
        self.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))

    def emit(self, record):
        self.stream = self.fixed or sys.stderr
        super().emit(record)


def show_progress(stream=None) -> None:
    """Print the ``grail`` logger's INFO lines on `stream` (default: stderr); one handler per
    process, pointed at the latest call's stream."""
    for handler in logger.handlers:
        if isinstance(handler, _Lines):
            handler.fixed = stream
            return
    logger.addHandler(_Lines(stream))
    logger.setLevel(logging.INFO)
    logger.propagate = False


class Progress:
    """``what: done/total (seconds)`` lines, at most one every `every` seconds."""

    def __init__(self, what: str, total: int, every: float = 10.0):
        self.what, self.total, self.every = what, total, every
        self.started = self.shown = time.monotonic()
        logger.info("%s: 0/%d", what, total)

    def update(self, done: int, detail: str = "") -> None:
        now = time.monotonic()
        if done < self.total and now - self.shown < self.every:
            return
        self.shown = now
        extra = f", {detail}" if detail else ""
        logger.info("%s: %d/%d (%.0f s%s)", self.what, done, self.total, now - self.started, extra)
