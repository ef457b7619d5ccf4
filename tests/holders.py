"""Another process holding something (a folder, a lease) while a test tries to take it."""

from __future__ import annotations

import subprocess
import sys


def holding(take: str) -> subprocess.Popen:
    """A Python process that runs `take` (statements; a ``with`` block's header ending in
    ``:`` keeps what it takes while the process sleeps) and then sleeps two minutes; returned
    once it holds it. Kill it to end the hold as a crash would."""
    body = " print('held', flush=True)\n time.sleep(120)"
    code = (
        f"import time\n{take}\n{body}"
        if take.endswith(":")
        else (f"import time\n{take}\nif True:\n{body}")
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held", "the holder did not take it"
    return process
