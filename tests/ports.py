"""Local servers for the tests: a free port on 127.0.0.1, and a process started and waited for."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(
    command: list[str],
    ready_url: str,
    name: str,
    timeout: float = 120,
    env: dict | None = None,
    log: Path | None = None,
) -> subprocess.Popen:
    """Start `command` and return once `ready_url` answers (fail the test if it never does);
    its output goes to `log` when given (quoted in the failure), else nowhere."""
    output = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 (the server keeps it)
    server = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)

    def failure(message: str) -> str:
        return message + (f"; its log ends:\n{log.read_text()[-4000:]}" if log else "")

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(ready_url, timeout=2)
            return server
        except OSError:
            if server.poll() is not None:
                pytest.fail(failure(f"{name} exited with status {server.returncode}"))
            time.sleep(0.3)
    server.kill()
    pytest.fail(failure(f"{name} did not answer {ready_url} within {timeout:.0f} s"))


def stop_server(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()


def answer_json(handler, body, status: int = 200) -> None:
    """Send `body` as a JSON response from an http.server request handler."""
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
