"""Headless Chromium for the tests: the DOM of a page after its JavaScript ran, or a screenshot.

Chromium is run once per call (``--headless=new``) with a fresh temporary profile, so nothing a
page keeps in localStorage (MLflow's UI keeps its table settings there) carries from one call to
the next. ``--virtual-time-budget`` lets the page's timers run for `wait_ms` of virtual time;
virtual time stands still while a fetch is pending, so a single page app's API calls finish
within the budget however slow the machine is, and Chromium exits as soon as it is spent.
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
    "--mute-audio",
)
WAIT_MS = 10_000


def chromium() -> str | None:
    """The Chromium (or Chrome) executable on PATH, or None."""
    return next(filter(None, map(shutil.which, NAMES)), None)


def _run(url: str, action: list[str], wait_ms: int, size: str, timeout: float) -> str:
    binary = chromium()
    if binary is None:
        raise RuntimeError(f"no browser on PATH (looked for {', '.join(NAMES)})")
    with tempfile.TemporaryDirectory(prefix="grail-chromium-") as profile:
        done = subprocess.run(
            [
                binary,
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={size}",
                f"--virtual-time-budget={wait_ms}",
                *action,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=profile,
        )
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise RuntimeError(f"chromium exited with {done.returncode}: {said[-1] if said else ''}")
    return done.stdout


def dump_dom(
    url: str, wait_ms: int = WAIT_MS, size: str = "1600,1000", timeout: float = 120
) -> str:
    """The page's DOM (HTML) once `wait_ms` of virtual time has passed after loading `url`."""
    return _run(url, ["--dump-dom"], wait_ms, size, timeout)


def screenshot(
    url: str,
    path: Path | str,
    wait_ms: int = WAIT_MS,
    size: str = "1600,1000",
    timeout: float = 120,
) -> Path:
    """A PNG of the window (`size`, "width,height") once `wait_ms` of virtual time has passed."""
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    _run(url, [f"--screenshot={path}"], wait_ms, size, timeout)
    if not path.is_file():
        raise RuntimeError(f"chromium wrote no screenshot for {url}")
    return path


def text(dom: str) -> list[str]:
    """The visible text of `dom`, one line per text node (scripts, styles and svg dropped)."""
    dom = re.sub(r"<(script|style|svg|noscript)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return [
        line for line in (html.unescape(part).strip() for part in re.split(r"<[^>]*>", dom)) if line
    ]
