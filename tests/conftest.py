"""Shared fixtures. Every cache and home-like folder points into a temporary folder: tests write
nothing under ``~``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from raw_builder import person, session, video, write_raw

_SANDBOX = Path(tempfile.mkdtemp(prefix="grail-tests-"))
for _name in ("HF_HOME", "XDG_CACHE_HOME", "MPLCONFIGDIR", "TRANSFORMERS_CACHE", "TORCH_HOME"):
    os.environ[_name] = str(_SANDBOX / _name.lower())
os.environ["HOME"] = str(_SANDBOX / "home")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"


@pytest.fixture(scope="session")
def default_study(tmp_path_factory) -> Path:
    """The default-size synthetic study (about 6k participants), simulated once per session."""
    from grail.simulate import simulate

    out = tmp_path_factory.mktemp("default_study")
    simulate(out, seed=7)
    return out


@pytest.fixture(scope="session")
def default_clean(default_study, tmp_path_factory) -> Path:
    from grail.clean import clean

    out = tmp_path_factory.mktemp("default_clean")
    clean(default_study, out)
    return out


@pytest.fixture(scope="session")
def small_study(tmp_path_factory) -> Path:
    from grail.simulate import simulate

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
