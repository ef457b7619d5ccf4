"""Progress lines: one at the start, at most one per interval, one at the end."""

from __future__ import annotations

import io
import logging

from grail.core.progress import Progress, show_progress


def test_progress_lines_are_throttled_and_the_last_always_shows(monkeypatch):
    stream = io.StringIO()
    show_progress(stream)
    clock = iter([0.0, 1.0, 2.0, 12.5, 13.0, 14.0])
    monkeypatch.setattr("grail.core.progress.time.monotonic", lambda: next(clock))
    progress = Progress("completions", 5, every=10.0)
    for done in range(1, 6):
        progress.update(done)
    lines = [line.split(" ", 1)[1] for line in stream.getvalue().splitlines()]
    assert lines == ["completions: 0/5", "completions: 3/5 (12 s)", "completions: 5/5 (14 s)"]
    show_progress()  # the same handler, back on stderr
    handlers = logging.getLogger("grail").handlers
    assert sum(type(h).__name__ == "_Lines" for h in handlers) == 1
