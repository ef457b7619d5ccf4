"""What ``grail run --local`` shows: one line per task, progress, and the branches' rows.

kfp.local prints each task's executor input, its whole log and its outputs to standard
output (docs/pins.md#kfp-217): several hundred lines, two issues interleaved.
:class:`TaskLines` sends all of that to a log file and writes to the terminal one line per task
(name, issue, status, time), a progress line while tasks run longer than ~10 s, and remembers
each task's outputs for :func:`branch_rows`, which the task's closing table prints (its
``closing_table`` part, :data:`grail.tasks.PARTS`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
import warnings
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

from grail.launch.kfp_local import every_task_wrapped

PROGRESS_EVERY = 15.0  # seconds between progress lines
SLOW = 10.0  # a task running longer than this shows up in them


ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Plain:
    """A text file that drops ANSI colour codes (kfp.local colours task names and states)."""

    def __init__(self, file):
        self.file = file

    def write(self, text: str) -> int:
        return self.file.write(ANSI.sub("", text))

    def flush(self) -> None:
        self.file.flush()

    def __getattr__(self, name: str):
        return getattr(self.file, name)


def task_label(component_name: str) -> str:
    """The task a kfp.local component name stands for.

    >>> task_label("comp-train-2"), task_label("comp-start-tracking")
    ('train', 'start-tracking')
    """
    return re.sub(r"-\d+$", "", component_name.removeprefix("comp-"))


class TaskLines:
    """Task lines on `terminal`; kfp.local's output into `log`."""

    def __init__(self, terminal, log: Path, every: float = PROGRESS_EVERY):
        self.terminal, self.log, self.every = terminal, log, every
        self.finished: list[dict] = []
        self.running: dict[int, tuple[str, float]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def say(self, text: str) -> None:
        with self.lock:  # not print(): kfp.local indents print() while a task runs
            self.terminal.write(text + "\n")
            self.terminal.flush()

    def wrap(self, run_task):
        """`run_task` (kfp.local's run_single_task_implementation) with a line per task."""

        def run(*args, **kwargs):
            label = task_label(kwargs["component_name"])
            arguments = kwargs.get("arguments", {})
            issue = str(arguments.get("issue", ""))
            algorithm = str(arguments.get("algorithm", ""))
            branch = f"{issue} {algorithm}".strip()
            started = time.monotonic()
            key = id(threading.current_thread()) ^ id(kwargs)
            with self.lock:
                self.running[key] = (f"{label} {branch}".strip(), started)
            outputs, status = {}, None
            try:
                outputs, status = run_task(*args, **kwargs)
                return outputs, status
            finally:
                with self.lock:
                    self.running.pop(key, None)
                seconds = time.monotonic() - started
                state = getattr(status, "name", "FAILURE") if status is not None else "FAILURE"
                self.say(f"  {label:<16} {branch:<20} {state:<8} {seconds:6.1f} s")
                paths = {k: getattr(v, "path", None) for k, v in (outputs or {}).items()}
                self.finished.append(
                    {
                        "task": label,
                        "branch": branch,
                        "status": state,
                        "outputs": paths,
                    }
                )

        return run

    def _progress(self) -> None:
        while not self.stop.wait(self.every):
            now = time.monotonic()
            with self.lock:
                slow = [f"{n} {now - t:.0f} s" for n, t in self.running.values() if now - t > SLOW]
            if slow:
                self.say(f"  ... running: {', '.join(sorted(slow))}")

    @contextmanager
    def attached(self):
        """While the pipeline runs: kfp.local's output to the log, task lines to the terminal."""
        ticker = threading.Thread(target=self._progress, daemon=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with (
            self.log.open("a", buffering=1) as file,
            redirect_stdout(log := Plain(file)),
            warnings.catch_warnings(),
        ):
            # kfp.local's own notes on every task: platform settings it ignores, and the image
            # it does not use (SubprocessRunner runs tasks in this environment by design).
            warnings.filterwarnings("ignore", message=r"Task '.*': settings")
            warnings.filterwarnings("ignore", message=r"You may be attemping to run a task")
            # Parallel tasks swap the root logger's handlers (logging_utils.local_logger_context);
            # one to the log keeps logging.error from calling basicConfig (stderr) in between.
            root = logging.getLogger()
            handler = logging.StreamHandler(log)
            root.addHandler(handler)
            ticker.start()
            try:
                with every_task_wrapped(self.wrap):
                    yield self
            finally:
                self.stop.set()
                root.removeHandler(handler)

    def outputs(self, task: str) -> dict[str, dict]:
        """Branch ("ISSUE ALGORITHM", or "" for a task of the whole run) -> output paths of the
        successful runs of `task`."""
        return {
            r["branch"]: r["outputs"]
            for r in self.finished
            if r["task"] == task and r["status"] == "SUCCESS"
        }


def branch_rows(benchmarks: dict[str, dict], gates: dict[str, dict] | None = None) -> list[dict]:
    """Per issue and algorithm: the benchmark's headline, where its report and charts are, and
    the promotion gate's decision in words (`gates`: the promote tasks' outputs by branch)."""
    from grail.benchmark.stage import headline
    from grail.export.promotion import in_words, read_decision

    rows = []
    for branch, paths in sorted(benchmarks.items()):
        gate = (gates or {}).get(branch, {}).get("decision")
        folder = Path(paths["results"])
        result = json.loads((folder / "metrics.json").read_text())
        rows.append(
            {
                **result["branch"],
                **headline(result),
                "report": str(folder / "report.md"),
                "charts": [str(folder / c) for c in result.get("charts", [])],
                "promotion": in_words(read_decision(gate)) if gate else "",
            }
        )
    return rows


def mlflow_pointer(tracking_uri: str, experiment: str) -> str:
    """How to open this experiment's runs: the `mlflow ui` command for a local store, the
    server's runs page otherwise (the default page of an MLflow 3 experiment is its traces)."""
    from mlflow.tracking import MlflowClient

    from grail.core.run_notes import runs_page

    found = MlflowClient(tracking_uri).get_experiment_by_name(experiment)
    page = runs_page(found.experiment_id) if found else ""
    if tracking_uri.startswith(("http://", "https://")):
        return f"MLflow runs: {tracking_uri.rstrip('/')}/{page}"
    beside = Path(sys.executable).parent / "mlflow"  # runs without the venv activated
    mlflow = str(beside) if beside.is_file() else f"{sys.executable} -m mlflow"
    return (
        f"MLflow: {mlflow} ui --backend-store-uri {tracking_uri} --port 5000\n"
        f"        then open http://127.0.0.1:5000/{page}"
    )
