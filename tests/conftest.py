"""Shared fixtures. Every cache and home-like folder points into a temporary folder: tests write
nothing under ``~``."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
from ports import free_port, start_server, stop_server
from raw_builder import person, session, video, write_raw

_SANDBOX = Path(tempfile.mkdtemp(prefix="grail-tests-"))
for _name in ("HF_HOME", "XDG_CACHE_HOME", "MPLCONFIGDIR", "TRANSFORMERS_CACHE", "TORCH_HOME"):
    os.environ[_name] = str(_SANDBOX / _name.lower())
os.environ["HOME"] = str(_SANDBOX / "home")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
# A killed training's checkpoint_uri lease is taken over once it has gone unrenewed this long
# (grail.core.lease; 30 s by default): the tests that kill and resume a training wait 6.
os.environ.setdefault("GRAIL_LEASE_TTL", "6")


@pytest.fixture(scope="session")
def default_study(tmp_path_factory) -> Path:
    """The default-size synthetic study (about 6k participants), simulated once per session."""
    from grail.tasks.slate.simulate import simulate

    out = tmp_path_factory.mktemp("default_study")
    simulate(out, seed=7)
    return out


@pytest.fixture(scope="session")
def default_clean(default_study, tmp_path_factory) -> Path:
    from grail.clean.stage import clean

    out = tmp_path_factory.mktemp("default_clean")
    clean(default_study, out)
    return out


@pytest.fixture(scope="session")
def small_study(tmp_path_factory) -> Path:
    from grail.tasks.slate.simulate import simulate

    out = tmp_path_factory.mktemp("small_study")
    simulate(out, participants=240, seed=11)
    return out


@pytest.fixture
def tiny_raw(tmp_path) -> Path:
    """Two participants, a few steps, with one off-slate click and one duplicate session."""
    videos = [video(v) for v in "abcdefgh"]
    sessions = [
        session("s1", "u1", ["a", "b", "c", "h"], [["b", "d"], ["e", "c", "f"], ["d", "e"]]),
        session(
            "s2",
            "u2",
            ["a", "d", "g"],
            {"1-recs": ["b", "c", "d"], "2-recs": ["g", "f"]},
            start=5000,
        ),
        session("s2-again", "u2", ["a", "b"], [["b", "c"]], start=90_000),
    ]
    survey = [person("W1", "u1"), person("W2", "u2", gun_index_2="0.2")]
    return write_raw(tmp_path / "raw", sessions, survey, videos)


@pytest.fixture(scope="session")
def small_clean(small_study, tmp_path_factory) -> Path:
    from grail.clean.stage import clean

    out = tmp_path_factory.mktemp("small_clean")
    clean(small_study, out)
    return out


@pytest.fixture(scope="session")
def tiny_policy(small_clean, tmp_path_factory) -> Path:
    """Tiny policy whose answer format was warmed up as the embedded default's, so GRPO
    rewards vary."""
    from grail.tasks.slate.warmup import STEPS as TINY_WARMUP
    from grail.train.tiny import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("tiny_model"), data=small_clean, format_warmup=TINY_WARMUP
    )


@pytest.fixture(scope="session")
def tiny_discriminator(small_clean, tmp_path_factory) -> Path:
    from grail.train.tiny import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("tiny_discriminator"), data=small_clean, task="classifier"
    )


@pytest.fixture
def error_line(capsys):
    """`grail ARGV` run in this process (grail.cli.main, the `grail` command's function), for a
    command whose own process would spend 10-13 s importing TRL before its error: it exits 2
    with no traceback, and the last line on stderr (returned) starts ``grail: error: ``."""
    from grail.cli import main

    def run(argv: list[str]) -> str:
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith("grail: error: "), err[-3000:]
        return last

    return run


@pytest.fixture(scope="session")
def s3_server():
    """A real HTTP S3 endpoint on 127.0.0.1 (moto's server), for boto3: one request at a time,
    so that a conditional write is atomic, as on S3 (tests/s3_server.py)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(
        [sys.executable, str(Path(__file__).parent / "s3_server.py"), "127.0.0.1", str(port)],
        url,
        "moto's S3 server",
        timeout=30,
    )
    yield url
    stop_server(server)


@pytest.fixture
def s3(s3_server, monkeypatch):
    """Environment pointing boto3 at the moto server, and a fresh bucket; yields the bucket name."""
    import uuid

    import boto3

    for name, value in {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    bucket = f"grail-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture(scope="session")
def served_tiny_model(tiny_policy):
    """`transformers serve` of the tiny model on 127.0.0.1; yields its /v1 URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(
        [
            str(Path(sys.executable).parent / "transformers"),
            "serve",
            str(tiny_policy),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--device",
            "cpu",
        ],
        f"{url}/health",
        "transformers serve",
    )
    yield f"{url}/v1"
    stop_server(server)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1 with a sqlite backend."""
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(
        [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{folder / 'db.sqlite'}",
            "--artifacts-destination",
            str(folder / "artifacts"),
        ],
        f"{url}/health",
        "mlflow server",
        env=os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    yield url
    stop_server(server)


# The integration tier (make test-integration): a test that uses one of these fixtures runs a
# real subsystem (moto's S3 server, a TRL-trained or TRL-built model, an MLflow server, a
# browser); whole modules that run kfp.local DAGs or training processes say so themselves
# (``pytestmark = pytest.mark.integration``). Everything else is the unit tier (make test).
INTEGRATION_FIXTURES = {
    "s3_server",
    "s3",
    "tiny_policy",
    "tiny_discriminator",
    "served_tiny_model",
    "mlflow_server",
    "local_run",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        on_s3 = "s3" in params.values()  # a fixture parametrized over folder and S3
        if on_s3 or INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
