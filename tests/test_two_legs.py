"""tests/two_legs.sh, how make test-integration runs its tier: the whole-DAG modules alone, then
two legs side by side that together hold every other module, each pytest in its own TMPDIR,
and the tier failing when any of the three fails (a python stand-in records each call)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "two_legs.sh"
MARKER = "integration and not vllm and not rehearsal"

# Records its TMPDIR and arguments, prints a line, and fails where FAIL_ON names an argument.
STAND_IN = """#!/usr/bin/env bash
echo "$TMPDIR|${OMP_NUM_THREADS:-unset}|$*" >> "$RECORD"
echo "pytest output of: $*"
for arg in "$@"; do [ "$arg" = "${FAIL_ON:-}" ] && exit 1; done
exit 0
"""


def _make_lists() -> dict[str, list[str]]:
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    return {
        name: re.search(rf"^{name} \?= (.+)$", makefile, re.M).group(1).split()
        for name in ("INTEGRATION_ALONE", "INTEGRATION_LEG")
    }


def _run(
    tmp_path: Path, fail_on: str = "", timings: Path | None = None
) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """two_legs.sh with the Makefile's lists and a stand-in python: its output and the calls
    (TMPDIR, OMP_NUM_THREADS, arguments), the DAG modules' first."""
    python = tmp_path / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    record = tmp_path / "record"
    lists = _make_lists()
    inherited = {"OMP_NUM_THREADS", "CI_TIMINGS"}  # .ci/run's list of steps, when under CI
    env = (
        {k: v for k, v in os.environ.items() if k not in inherited}
        | {
            "RECORD": str(record),
            "FAIL_ON": fail_on,
            "TMPDIR": str(tmp_path),
            "GRAIL_INTEGRATION_ALONE": " ".join(lists["INTEGRATION_ALONE"]),
            "GRAIL_INTEGRATION_LEG": " ".join(lists["INTEGRATION_LEG"]),
        }
        | ({"CI_TIMINGS": str(timings)} if timings else {})
    )
    done = subprocess.run(
        ["bash", str(SCRIPT), str(python), MARKER, "--durations=15"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = [line.split("|", 2) for line in record.read_text().splitlines()]
    return done, calls


def test_the_makefile_lists_name_existing_modules_once():
    lists = _make_lists()
    named = lists["INTEGRATION_ALONE"] + lists["INTEGRATION_LEG"]
    assert len(named) == len(set(named)), named
    assert all((ROOT / module).is_file() for module in named), named
    assert 'bash tests/two_legs.sh $(PY) "integration and not vllm and not rehearsal"' in (
        (ROOT / "Makefile").read_text().replace("\\\n\t\t", "")
    )


def test_the_dag_modules_run_alone_then_two_legs_hold_every_other_module(tmp_path):
    done, calls = _run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lists = _make_lists()
    alone, first, second = (arguments.split() for *_, arguments in calls[:1] + sorted(calls[1:]))
    if "--ignore" in " ".join(first):  # the legs start together: their order is the machine's
        first, second = second, first
    assert len(calls) == 3 and len({folder for folder, *_ in calls}) == 3  # a TMPDIR each
    # the DAG modules keep the caller's threads; each leg runs torch on one
    assert [threads for _, threads, _ in calls] == ["unset", "1", "1"]
    assert alone[:3] == ["-m", "pytest", "-m"] and alone[-1] == "--durations=15"
    assert set(alone) >= set(lists["INTEGRATION_ALONE"]) and not set(alone) & set(
        lists["INTEGRATION_LEG"]
    )
    assert set(first) >= set(lists["INTEGRATION_LEG"])
    ignored = {arg.removeprefix("--ignore=") for arg in second if arg.startswith("--ignore=")}
    assert ignored == set(lists["INTEGRATION_ALONE"] + lists["INTEGRATION_LEG"])
    assert not list(tmp_path.glob("grail-integration.*"))  # its folders, removed on success
    # the first leg's output is printed once the second leg has ended
    assert "pytest output of: -m pytest -m " in done.stdout.split("the first leg (")[1]


@pytest.mark.parametrize("fail_on", ["tests/test_pipeline.py", "tests/test_lease.py", "--ignore"])
def test_the_tier_fails_when_any_pytest_fails(tmp_path, fail_on):
    if fail_on == "--ignore":  # the second leg: the stand-in fails on its first --ignore=...
        fail_on = f"--ignore={_make_lists()['INTEGRATION_ALONE'][0]}"
    done, calls = _run(tmp_path, fail_on)
    assert done.returncode != 0 and len(calls) == 3, done.stdout + done.stderr
    assert "exit 1" in done.stdout
    (kept,) = tmp_path.glob("grail-integration.*")  # a failed tmp_path stays to be read
    assert str(kept) in done.stderr


def test_under_ci_each_phase_joins_its_list_of_steps(tmp_path):
    timings = tmp_path / "timings.log"
    timings.write_text("make install: 90 s\n")
    done, _ = _run(tmp_path, timings=timings)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = timings.read_text().splitlines()
    assert lines[0] == "make install: 90 s" and len(lines) == 4, lines  # appended, not rewritten
    assert [line.split(":")[0].split(" (")[0] for line in lines[1:]] == [
        "  the whole-DAG modules alone",
        "  the second leg",
        "  the first leg",
    ]
    assert all(re.search(r": exit 0, \d+ s$", line) for line in lines[1:]), lines
