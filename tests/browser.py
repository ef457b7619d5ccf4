"""Headless Chromium for the tests: a page's DOM after its JavaScript ran, or a screenshot of it.

Each call runs Chromium once (``--headless=new``) with a fresh temporary profile, so nothing a
page keeps in localStorage (the MLflow UI keeps its table layout and GenAI / Model training
choice there) carries from one call to the next. ``--virtual-time-budget`` lets the page's timers
run for `wait_ms` of virtual time, and virtual time stands still while a fetch is pending: a
single page app's API calls finish within the budget however slow the machine, and Chromium
exits as soon as the budget is spent (about 5 s for an MLflow page on 2 cores, 10 s under load).
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless=new",
    "--no-sandbox",  # the tests run as root
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
)
WAIT_MS = 10_000
SIZE = "1600,1000"


def chromium() -> str | None:
    """The Chromium (or Chrome) on PATH, or None."""
    return next(filter(None, map(shutil.which, NAMES)), None)


def _run(url: str, action: str, wait_ms: int, size: str, timeout: float) -> str:
    binary = chromium()
    if binary is None:
        raise RuntimeError(f"no browser on PATH (looked for {', '.join(NAMES)})")
    with tempfile.TemporaryDirectory(prefix="grail-chromium-", ignore_cleanup_errors=True) as home:
        command = [binary, *FLAGS, f"--user-data-dir={home}", f"--window-size={size}"]
        budget = f"--virtual-time-budget={max(wait_ms, 1)}"  # 0: never done
        done = subprocess.run(
            [*command, budget, action, url],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise RuntimeError(f"chromium exited with {done.returncode}: {said[-1] if said else ''}")
    return done.stdout


def dump_dom(url: str, wait_ms: int = WAIT_MS, size: str = SIZE, timeout: float = 120) -> str:
    """The DOM (HTML) of `url` once `wait_ms` of virtual time has passed."""
    return _run(url, "--dump-dom", wait_ms, size, timeout)


def screenshot(
    url: str, path: Path | str, wait_ms: int = WAIT_MS, size: str = SIZE, timeout: float = 120
) -> Path:
    """A PNG of the window (`size`: "width,height") on `url` once `wait_ms` of virtual time has
    passed, written to `path`."""
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    _run(url, f"--screenshot={path}", wait_ms, size, timeout)
    if not path.is_file():
        raise RuntimeError(f"chromium wrote no screenshot of {url}")
    return path


def text(dom: str) -> list[str]:
    """The text of `dom`, one entry per text node (scripts, styles and svg left out)."""
    dom = re.sub(r"<(script|style|svg|noscript)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    parts = (html.unescape(part).strip() for part in re.split(r"<[^>]*>", dom))
    return [part for part in parts if part]
