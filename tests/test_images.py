"""Container images: hadolint-clean, non-root, labelled, installing from the one pinned list."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from grail.images import IMAGE, TRAIN_IMAGE

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.train"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile):
    hadolint = Path(sys.executable).parent / "hadolint"
    done = subprocess.run(
        [str(hadolint), str(dockerfile)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_non_root_labelled_and_pinned(dockerfile):
    text = dockerfile.read_text()
    assert re.search(r"^USER 10001$", text, re.M)
    for label in ("title", "description", "version", "licenses", "source"):
        assert f"org.opencontainers.image.{label}=" in text
    assert "requirements/constraints.txt" in text  # the Makefile's pins, one source of truth
    assert re.search(r"^FROM python:3\.11\.\d+-slim-bookworm$", text, re.M)


def test_image_references_come_from_one_place():
    makefile = (ROOT / "Makefile").read_text()
    assert "grail.images" in makefile
    assert IMAGE.endswith(":0.1.0") and TRAIN_IMAGE.endswith(":0.1.0")
    pipeline = (ROOT / "pipelines" / "grail.py").read_text()
    assert "from grail.images import IMAGE, TRAIN_IMAGE" in pipeline
    assert "ghcr.io" not in pipeline
