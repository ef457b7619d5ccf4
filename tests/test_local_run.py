"""`grail run --local` when something goes wrong: the failing task's own line, exit 2 for bad
input; the container engine found (or one line saying what to install)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grail.core.errors import GrailError
from grail.launch.engine import NO_ENGINE, docker_api, why_unreachable

pytestmark = pytest.mark.integration  # kfp.local runs of the DAG

ROOT = Path(__file__).resolve().parents[1]


def grail_run(*argv: str, cwd: Path = ROOT, env: dict | None = None):
    return subprocess.run(
        [sys.executable, "-m", "grail.cli", "run", "--local", *argv],
        cwd=cwd,
        env=(env or os.environ) | {"PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv, line",
    [
        # one failing task each (a whole `grail run --local` costs 30-60 s on 2 cores): the
        # first task's input error, and the next task's (what any task's error takes)
        (["--raw", "/no/such/raw"], "clean failed: /no/such/raw: raw export folder not found"),
        (
            ["--recipe", "recipes/tiny/missing_{algorithm}.yaml"],
            "start-tracking failed: recipes/tiny/missing_grpo.yaml: recipe not found",
        ),
    ],
)
def test_a_failed_run_ends_with_the_tasks_own_line(argv, line, tmp_path):
    """Not kfp.local's "Pipeline 'grail' finished with status FAILURE" in colour codes, nor
    another task's executor JSON: the failing task's grail error, the log's path, exit 2."""
    done = grail_run(*argv, "--outputs", str(tmp_path))
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    log = tmp_path / "pipeline.log"
    assert done.stderr.startswith(f"grail: error: {line}"), done.stderr
    assert done.stderr.endswith(f"; log: {log}\n") and done.stderr.count("\n") == 1
    assert "\x1b[" not in done.stdout + done.stderr  # no terminal here: no colour codes
    assert "executor" not in done.stdout and "Traceback" not in done.stdout
    assert "\x1b[" not in log.read_text()  # the log is a file: no colour codes either
    assert "Traceback" in log.read_text()  # the whole story stays there


def test_a_bug_in_a_task_exits_1_with_its_type(tmp_path, monkeypatch):
    """A task failing with anything but an input error is our bug: exit 1, named by type."""
    from grail.core.errors import report_task_failure
    from grail.launch.local import failed_run
    from grail.launch.terminal import TaskLines

    log = tmp_path / "pipeline.log"
    lines = TaskLines(sys.stdout, log)
    lines.finished = [{"task": "benchmark", "branch": "gun_control grpo", "status": "FAILURE"}]
    with open(log, "w") as out, monkeypatch.context() as patched:
        patched.setattr(sys, "stderr", out)
        report_task_failure("benchmark", KeyError("step"), issue="gun_control", algorithm="grpo")
    error = failed_run(lines)
    assert error.exit_code == 1
    from grail.cli import _guarded

    def fail():
        raise error

    assert _guarded(fail, debug=False) == 1  # what `grail run --local` exits with
    assert str(error) == f"benchmark (gun_control grpo) failed: KeyError: 'step'; log: {log}"
    lines.finished.append({"task": "train", "branch": "minimum_wage grail", "status": "FAILURE"})
    assert "and 1 more: train (minimum_wage grail) failed without an error" in str(
        failed_run(lines)
    )


def test_issues_and_algorithms_choose_the_branches_and_an_unknown_issue_is_one_line(tmp_path):
    from grail.core.config import parse_config
    from grail.launch.local import RunConfig, local_arguments, run_local

    argv = ["--local", "--issues", "minimum_wage", "--algorithm", "grail"]
    (config,), _ = parse_config((RunConfig,), argv, "run")
    # given: the values replace the default's two (argparse's extend would add to them)
    assert (config.issues, config.algorithms) == (["minimum_wage"], ["grail"])
    assert local_arguments(config, "dest", "r1")["issues"] == ["minimum_wage"]
    (config,), _ = parse_config((RunConfig,), ["--local"], "run")
    assert config.issues == []  # none given: the task's every issue (its branch_subjects)
    assert local_arguments(config, "dest", "r1")["issues"] == ["gun_control", "minimum_wage"]
    for issues in (["guns"], ["gun_control", "gun_control"]):
        with pytest.raises(GrailError, match=r"^--issues .*: choose distinct issues from gun_c"):
            run_local(RunConfig(issues=issues, outputs=str(tmp_path)))
    assert not list(tmp_path.iterdir())  # refused before anything ran


TASK_PROCESS = """
import atexit, gc, sys
from grail.core.errors import reported

atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))  # runs after ours

@reported("train")
def task(fail):
    if fail:
        raise ValueError("bad")
    return "done"

print(task(sys.argv[1] == "fail"))
"""


@pytest.mark.parametrize("outcome", ["succeed", "fail"])
def test_a_task_process_skips_the_final_collections_and_keeps_its_exit_status(outcome):
    """A task freezes what is left at exit (the interpreter's shutdown then skips its collector
    passes over torch's objects); its exit status and its failure line are unchanged."""
    done = subprocess.run(
        [sys.executable, "-c", TASK_PROCESS, outcome], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.splitlines()[-1] == "frozen at exit: True"
    if outcome == "fail":
        assert done.returncode == 1 and "ValueError: bad" in done.stderr
    else:
        assert done.returncode == 0 and done.stdout.startswith("done\n")


def test_no_container_engine_is_one_line_saying_what_to_install(tmp_path, monkeypatch, capsys):
    from grail.cli import main
    from grail.launch import engine

    monkeypatch.setattr(engine, "DOCKER_SOCKET", str(tmp_path / "docker.sock"))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no podman either
    assert main(["run", "--local", "--runner", "docker", "--outputs", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"grail: error: {NO_ENGINE}\n"


def test_a_docker_host_that_does_not_answer_is_named(tmp_path):
    host = f"unix://{tmp_path / 'nothing.sock'}"
    refused = pytest.raises(GrailError, match=f"DOCKER_HOST={host}: no Docker API answers there")
    with refused, docker_api(environ={"DOCKER_HOST": host}):
        pass


@pytest.mark.skipif(
    not shutil.which("podman"),
    reason="podman is not installed; the container tier (make test-containers) installs it and "
    "runs the whole DAG through this same path",
)
def test_podman_serves_the_docker_api_for_the_run_and_stops(tmp_path, monkeypatch):
    """With no DOCKER_HOST and no Docker socket: podman's Docker-compatible service on a
    private socket, answering while the run lasts, gone afterwards."""
    from grail.launch import engine

    monkeypatch.setattr(engine, "DOCKER_SOCKET", str(tmp_path / "docker.sock"))
    with docker_api(environ={}) as host:
        assert host.startswith("unix:///") and why_unreachable(host) is None
        socket = Path(host.removeprefix("unix://"))
        with pytest.raises(GrailError, match="localhost/grail:no-such-tag is not in the"):
            engine.check_image(host, "localhost/grail:no-such-tag")
    assert not socket.exists() and why_unreachable(host) is not None
    running = subprocess.run(["pgrep", "-f", str(socket)], capture_output=True, text=True)
    assert running.stdout == ""


def test_the_printed_mlflow_ui_command_runs_as_printed(tmp_path):
    """The closing lines' `mlflow ui ...` works without the venv activated (PATH without
    it): started as printed (on a free port), it serves the experiment's runs."""
    import shlex
    import urllib.request

    from mlflow.tracking import MlflowClient
    from ports import free_port, start_server, stop_server

    from grail.launch.terminal import mlflow_pointer

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = MlflowClient(store).create_experiment("grail-local")
    command, page = mlflow_pointer(store, "grail-local").splitlines()
    argv = shlex.split(command.removeprefix("MLflow: "))
    assert argv[argv.index("--port") + 1] == "5000" and f"/#/experiments/{experiment}/runs?" in page
    port = str(free_port())
    argv[argv.index("--port") + 1] = port
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MLFLOW_DISABLE_TELEMETRY": "true"}
    server = start_server(argv, f"http://127.0.0.1:{port}/health", "mlflow ui", env=env)
    try:
        url = f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/experiments/get?experiment_id="
        with urllib.request.urlopen(url + experiment, timeout=30) as answer:
            assert b'"grail-local"' in answer.read()
    finally:
        stop_server(server)


def test_two_runs_started_together_with_one_name_one_goes_on(tmp_path):
    """Two `grail run --local --run-name same` into one --outputs, started together, both
    wrote into one folder and both succeeded (the name check was check-then-create): the
    run's folder is made at once, so exactly one goes on and the other stops in one line
    before any task runs."""
    import signal
    import time

    argv = [sys.executable, "-m", "grail.cli", "run", "--local", "--outputs", str(tmp_path)]
    argv += ["--run-name", "same"]
    runs = [
        subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
        for _ in range(2)
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while all(r.poll() is None for r in runs) and time.monotonic() < deadline:
            time.sleep(0.2)
        stopped = [r for r in runs if r.poll() is not None]
        assert len(stopped) == 1, "neither run stopped: both went on into one folder"
        err = stopped[0].stderr.read().strip().splitlines()
        assert stopped[0].returncode == 2 and len(err) == 1, err
        assert "grail-grpo+grail-same exists: give this run another --run-name" in err[0]
        time.sleep(2)
        going = next(r for r in runs if r is not stopped[0])
        assert going.poll() is None  # the other one runs on, alone in its folder
    finally:
        for run in runs:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
    assert [p.name for p in (tmp_path / "pipeline_root").iterdir()] == ["grail-grpo+grail-same"]
