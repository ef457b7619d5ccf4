""".ci/run's list of steps: every step's seconds printed again when the run ends, however it ends.
CI shows only the tail of a run's output, so a run stopped at CI's limit (SIGTERM) must end by
saying where its time went. A stand-in make records its targets and hangs on one of them."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Records its targets; hangs (until killed) on the target that HANG_ON names.
STAND_IN = """#!/usr/bin/env bash
echo "$*" >> "$RECORD"
if [ "$*" = "${HANG_ON:-}" ]; then touch "$RECORD.hung"; exec sleep 120; fi
exit 0
"""

FOREGROUND = [
    "make install",
    "make test (the unit tier, with lint and docs; 3.12's leg beside it)",
    "make test-integration",
    "make test-vllm",
    "make dag-in-image (the whole DAG in the image built above)",
]


def _start(tmp_path: Path, hang_on: str = "") -> tuple[subprocess.Popen, Path]:
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci" / "run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "make").write_text(STAND_IN)
    (bin_dir / "make").chmod(0o755)
    record = tmp_path / "record"
    env = {k: v for k, v in os.environ.items() if k != "CI_TIMINGS"} | {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RECORD": str(record),
        "HANG_ON": hang_on,
        "TMPDIR": str(tmp_path),
    }
    process = subprocess.Popen(
        ["bash", str(repo / ".ci" / "run")],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as CI's runner signals one
    )
    return process, record


def _steps(output: str) -> list[str]:
    listed = output.split("== CI steps, seconds")[1].splitlines()[1:]
    return [line.split(": ")[0] for line in listed if not line.startswith(("running", "the whole"))]


# whole runs of .ci/run (every step a stand-in, about 5 s each) in a process group, killed by a
# signal: the integration tier, so the unit tier has its time for the learnability guard
@pytest.mark.integration
def test_a_whole_run_ends_with_every_step_and_its_seconds(tmp_path):
    process, record = _start(tmp_path)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    steps = _steps(output)
    assert [step for step in steps if step in FOREGROUND] == FOREGROUND, steps
    background = {"make install-vllm (background)", "Debian's packages and checkov (background)"}
    assert background | {"make test-rehearsal (beside the vLLM tier)"} <= set(steps), steps
    assert any(step.startswith("make test-python") for step in steps), steps
    assert any(step.startswith("make images-local (background") for step in steps), steps
    assert "running when the run ended" not in output
    assert output.rstrip().splitlines()[-1].startswith("the whole run: ")
    assert "check-images" in record.read_text()


@pytest.mark.integration
@pytest.mark.parametrize("hang_on", ["test-vllm", "test-integration"])
def test_a_run_stopped_by_sigterm_still_says_where_its_time_went(tmp_path, hang_on):
    process, record = _start(tmp_path, hang_on)
    deadline = time.monotonic() + 60
    while not Path(f"{record}.hung").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 143, output
    steps = _steps(output)
    done_before = FOREGROUND[
        : [step.split(" (")[0] for step in FOREGROUND].index(f"make {hang_on}")
    ]
    assert [step for step in steps if step in FOREGROUND] == done_before, steps
    tail = output.rstrip().splitlines()
    assert tail[-2].startswith(f"running when the run ended: make {hang_on}, for "), tail[-3:]
    assert tail[-1].startswith("the whole run: ")


def test_make_test_vllm_collects_every_module_marked_vllm():
    """`make test-vllm` collects only VLLM_TESTS: a module marked vllm outside it would never
    run, in CI or anywhere."""
    makefile = (ROOT / "Makefile").read_text()
    named = re.search(r"^VLLM_TESTS \?= (.+)$", makefile, re.M).group(1).split()
    assert all((ROOT / module).is_file() for module in named), named
    assert "-m vllm $(VLLM_TESTS)" in makefile
    marked = {
        path.relative_to(ROOT).as_posix()
        for folder in ("tests", "src", "components", "pipelines")
        for path in (ROOT / folder).rglob("*.py")
        if re.search(r"mark\.vllm\b", path.read_text(errors="replace"))
        and path.name != "test_ci_run.py"
    }
    assert marked == set(named), marked
