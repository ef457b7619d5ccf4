"""What ``grail run --local`` shows: one line per task, progress, and a closing table.

kfp.local prints each task's executor input, its whole log and its outputs to standard
output (docs/pins.md#kfp-217): several hundred lines, two issues interleaved.
:class:`TaskLines` sends all of that to a log file and writes to the terminal one line per task
(name, issue, status, time), a progress line while tasks run longer than ~10 s, and remembers
each task's outputs for :func:`closing_table`.
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
        from kfp.local import task_dispatcher

        original = task_dispatcher.run_single_task_implementation
        task_dispatcher.run_single_task_implementation = self.wrap(original)
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
                yield self
            finally:
                self.stop.set()
                root.removeHandler(handler)
                task_dispatcher.run_single_task_implementation = original

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
    from grail.benchmark.records import benchmark_headline
    from grail.export.promotion import in_words, read_decision

    rows = []
    for branch, paths in sorted(benchmarks.items()):
        gate = (gates or {}).get(branch, {}).get("decision")
        folder = Path(paths["results"])
        result = json.loads((folder / "metrics.json").read_text())
        rows.append(
            {
                **result["branch"],
                **benchmark_headline(result, result["trained"]),
                "report": str(folder / "report.md"),
                "charts": [str(folder / c) for c in result.get("charts", [])],
                "promotion": in_words(read_decision(gate)) if gate else "",
            }
        )
    return rows


def _number(row: dict, key: str, digits: int = 3) -> str:
    return f"{row[key]:.{digits}f}" if row.get(key) is not None else "-"


def _change(row: dict, metric: str, against: str = "start") -> str:
    """The final model minus step 0 (or the best baseline) on `metric`, with its interval ("-"
    when not measured)."""
    key = f"final_minus_{against}/{metric}"
    if row.get(f"{key}_difference") is None:
        return "-"
    low, high = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
    ci = f" [{low:+.3f}, {high:+.3f}]" if low is not None else ""
    return f"{row[f'{key}_difference']:+.3f}{ci}"


NO_WORSE = 0.005  # nats: a paired interval's upper bound this close to 0 is "no worse"


def prior_verdict(row: dict) -> str:
    """The first question, in words: is the final model better than always-first (the
    position prior) in log-loss? From the paired difference's 95% interval.

    >>> key = "final_minus_always_first/log_loss"
    >>> prior_verdict({f"{key}_ci_low": -0.03, f"{key}_ci_high": -0.01})
    'beats the position prior'
    >>> prior_verdict({f"{key}_ci_low": -0.01, f"{key}_ci_high": 0.004})
    'no worse than the position prior'
    >>> prior_verdict({f"{key}_ci_low": -0.01, f"{key}_ci_high": 0.02})
    'not shown to reach the position prior'
    >>> prior_verdict({f"{key}_ci_low": 0.01, f"{key}_ci_high": 0.05})
    'worse than the position prior'
    """
    key = "final_minus_always_first/log_loss"
    low, high = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
    if low is None or high is None:
        return ""
    if high < 0:
        return "beats the position prior"
    if low > 0:
        return "worse than the position prior"
    if high <= NO_WORSE:
        return "no worse than the position prior"
    return "not shown to reach the position prior"


def closing_table(rows: list[dict], comparison: dict | None = None, scored_as="choices") -> str:
    """Per issue and algorithm: the final model's accuracy, its log-loss against step 0's (the
    paired change with its participant-bootstrap interval: below 0 is better), the best
    baseline by accuracy, the ceiling (accuracy/log-loss) and a collapse flag; a line with its
    log-loss against always-first's, the position prior (paired likewise, and said in words:
    :func:`prior_verdict`); a line against the best baseline by log-loss; on a synthetic study a
    line with the expected log-loss (under the known choice model) and one with the normalised
    score (:func:`grail.benchmark.scores.normalised_scores`); whether RL had signal, in words
    (:mod:`grail.train.rl_signal`); the promotion gate's decision
    (:func:`grail.export.promotion.in_words`); then per issue the differences between algorithms.

    >>> print(closing_table([{"issue": "gun_control", "algorithm": "grpo", "accuracy": 0.4,
    ...     "ci_low": 0.31, "ci_high": 0.5, "log_loss": 1.2, "start_log_loss": 1.38,
    ...     "final_minus_start/log_loss_difference": -0.18,
    ...     "final_minus_start/log_loss_ci_low": -0.25, "final_minus_start/log_loss_ci_high": -0.1,
    ...     "best_baseline": "ranker", "best_baseline_accuracy": 0.56,
    ...     "best_log_loss_baseline": "most_frequent_position",
    ...     "best_log_loss_baseline_log_loss": 1.19,
    ...     "final_minus_best_baseline/log_loss_difference": 0.01,
    ...     "final_minus_best_baseline/log_loss_ci_low": -0.02,
    ...     "final_minus_best_baseline/log_loss_ci_high": 0.04,
    ...     "final_minus_always_first/log_loss_difference": -0.02,
    ...     "final_minus_always_first/log_loss_ci_low": -0.04,
    ...     "final_minus_always_first/log_loss_ci_high": -0.01,
    ...     "ceiling_accuracy": 0.65, "ceiling_log_loss": 0.9, "score_vs_prior": 6.2,
    ...     "score_vs_uniform": 51.0, "rl_signal": "RL had signal: 3 of 64 groups had equal"
    ...     " rewards over 2 steps (mean within-group reward std 0.21); the policy writes no"
    ...     " thought", "promotion": "promoted (champion): beats always-first: log-loss -0.020"
    ...     " [-0.040, -0.010]"}]))
    issue          algorithm  accuracy [95% CI]     log-loss  step 0  change [95% CI]          best baseline     ceiling
    gun_control    grpo       0.400 [0.31, 0.50]    1.200     1.380   -0.180 [-0.250, -0.100]  ranker 0.560      0.650/0.900
                              vs always-first       1.200             -0.020 [-0.040, -0.010]  beats the position prior
                              vs best by log-loss   1.200             +0.010 [-0.020, +0.040]  most_frequent_position 1.190
                              normalised score      6.2                                        % of always-first's gap to the ceiling closed (51.0 of uniform's)
                              RL had signal: 3 of 64 groups had equal rewards over 2 steps (mean within-group reward std 0.21); the policy writes no thought
                              promoted (champion): beats always-first: log-loss -0.020 [-0.040, -0.010]
    """  # noqa: E501 (the table as printed)
    if scored_as == "documents":  # the run's task has a reader read summaries
        return document_table(rows)
    lines = [
        f"{'issue':<14} {'algorithm':<10} {'accuracy [95% CI]':<21} {'log-loss':<9} "
        f"{'step 0':<7} {'change [95% CI]':<24} {'best baseline':<17} ceiling"
    ]
    for r in rows:
        ci = f" [{r['ci_low']:.2f}, {r['ci_high']:.2f}]" if "ci_low" in r else ""
        base = (
            f"{r['best_baseline']} {r['best_baseline_accuracy']:.3f}"
            if "best_baseline" in r
            else "-"
        )
        ceiling = f"{_number(r, 'ceiling_accuracy')}/{_number(r, 'ceiling_log_loss')}"
        lines.append(
            f"{r['issue']:<14} {r.get('algorithm', ''):<10} {_number(r, 'accuracy') + ci:<21} "
            f"{_number(r, 'log_loss'):<9} {_number(r, 'start_log_loss'):<7} "
            f"{_change(r, 'log_loss'):<24} {base:<17} {ceiling}"
        )
        lines += row_details(r)
    for issue, entry in ((comparison or {}).get("issues") or {}).items():
        for label, difference in entry["differences"].items():
            cells = [
                f"{metric} {d['difference']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]"
                for metric, d in difference.items()
            ]
            lines.append(f"{issue:<14} {label.replace('_minus_', '-'):<10} " + "; ".join(cells))
    return "\n".join(lines)


def row_details(r: dict) -> list[str]:
    """The lines under a closing-table row: the cloned warm start, the model against
    always-first and against the best baseline by log-loss, the expected log-loss, the
    normalised score, the RL signal and a collapse."""
    lines = []
    if r.get("cloned_log_loss") is not None:
        lines.append(
            f"{'':<14} {'':<10} {'behaviour cloning':<21} {_number(r, 'cloned_log_loss'):<9} "
            f"{'':<7} {'':<24} (the warm start RL continued from)"
        )
    if r.get("final_minus_always_first/log_loss_difference") is not None:
        lines.append(
            f"{'':<14} {'':<10} {'vs always-first':<21} {_number(r, 'log_loss'):<9} "
            f"{'':<7} {_change(r, 'log_loss', 'always_first'):<24} {prior_verdict(r)}"
        )
    if r.get("best_log_loss_baseline"):
        lines.append(
            f"{'':<14} {'':<10} {'vs best by log-loss':<21} {_number(r, 'log_loss'):<9} "
            f"{'':<7} {_change(r, 'log_loss', 'best_baseline'):<24} "
            f"{r['best_log_loss_baseline']} {_number(r, 'best_log_loss_baseline_log_loss')}"
        )
    if r.get("expected_log_loss") is not None:
        lines.append(
            f"{'':<14} {'':<10} {'expected log-loss':<21} "
            f"{_number(r, 'expected_log_loss'):<9} {_number(r, 'start_expected_log_loss'):<7} "
            f"{_change(r, 'expected_log_loss'):<24} (under the study's choice model)"
        )
    if r.get("score_vs_prior") is not None:
        lines.append(
            f"{'':<14} {'':<10} {'normalised score':<21} {r['score_vs_prior']:<9.1f} "
            f"{'':<7} {'':<24} % of always-first's gap to the ceiling closed "
            f"({_number(r, 'score_vs_uniform', 1)} of uniform's)"
        )
    if r.get("rl_signal"):
        lines.append(f"{'':<14} {'':<10} {r['rl_signal']}")
    if r.get("collapsed"):
        lines.append(f"{'':<14} {'':<10} COLLAPSED: {r['collapsed']}")
    if r.get("exported_step") is not None:
        lines.append(f"{'':<14} {'':<10} {exported_line(r)}")
    if r.get("promotion"):
        lines.append(f"{'':<14} {'':<10} {r['promotion']}")
    return lines


def exported_line(r: dict) -> str:
    """Which checkpoint the export takes, and why (:mod:`grail.benchmark.selection`).

    >>> exported_line({"exported_step": 4, "exported_reason": "the last checkpoint (step 4) "
    ...     "has the best log-loss"})
    'exported: step 4, the last checkpoint (step 4) has the best log-loss'
    """
    return f"exported: step {r['exported_step']}, {r['exported_reason']}"


def document_table(rows: list[dict]) -> str:
    """The summarize task's closing table: per algorithm, the share of hidden questions
    answered by the final model (document-bootstrap interval), by step 0, the paired change,
    the best baseline and the ceilings (oracle / full document); then whether training helped.

    >>> print(document_table([{"issue": "summarize", "algorithm": "grpo", "answered": 0.5,
    ...     "answered_ci_low": 0.45, "answered_ci_high": 0.55, "start_answered": 0.4,
    ...     "final_minus_start/answered_difference": 0.1,
    ...     "final_minus_start/answered_ci_low": 0.05,
    ...     "final_minus_start/answered_ci_high": 0.15, "best_baseline": "tfidf_centrality",
    ...     "best_baseline_answered": 0.71, "oracle_answered": 1.0,
    ...     "full_document_answered": 1.0}]))
    task       algorithm  answered [95% CI]   step 0  change [95% CI]          best baseline           ceiling
    summarize  grpo       0.500 [0.45, 0.55]  0.400   +0.100 [+0.050, +0.150]  tfidf_centrality 0.710  1.000/1.000
    grpo: beats its step 0 (the interval excludes zero)
    """  # noqa: E501 (the table as printed)
    lines = [
        f"{'task':<10} {'algorithm':<10} {'answered [95% CI]':<19} {'step 0':<7} "
        f"{'change [95% CI]':<24} {'best baseline':<23} ceiling"
    ]
    verdicts = []
    for r in rows:
        ci = (
            f" [{r['answered_ci_low']:.2f}, {r['answered_ci_high']:.2f}]"
            if "answered_ci_low" in r
            else ""
        )
        base = (
            f"{r['best_baseline']} {r['best_baseline_answered']:.3f}"
            if "best_baseline" in r
            else "-"
        )
        ceiling = f"{_number(r, 'oracle_answered')}/{_number(r, 'full_document_answered')}"
        lines.append(
            f"{'summarize':<10} {r.get('algorithm', ''):<10} {_number(r, 'answered') + ci:<19} "
            f"{_number(r, 'start_answered'):<7} {_change(r, 'answered'):<24} {base:<23} {ceiling}"
        )
        low = r.get("final_minus_start/answered_ci_low")
        high = r.get("final_minus_start/answered_ci_high")
        if low is None:
            verdict = "no step 0 to compare with"
        elif low > 0:
            verdict = "beats its step 0 (the interval excludes zero)"
        elif high < 0:
            verdict = "is worse than its step 0 (the interval excludes zero)"
        else:
            verdict = "does not beat its step 0 (the interval includes zero)"
        verdicts.append(f"{r.get('algorithm', '')}: {verdict}")
        if r.get("exported_step") is not None:
            verdicts.append(f"{r.get('algorithm', '')}: {exported_line(r)}")
        if r.get("promotion"):
            verdicts.append(f"{r.get('algorithm', '')}: {r['promotion']}")
    return "\n".join(lines + verdicts)


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
