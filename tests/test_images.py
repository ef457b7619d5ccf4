"""Container images: hadolint-clean, non-root, labelled, installing from the one pinned list."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from grail.core.images import IMAGE, TRAIN_IMAGE

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
    # The base and the package sources are build inputs (defaults: the public ones) ...
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11\.\d+-slim-bookworm$", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    # ... and the build's pip configuration and CA bundle are secrets, never a layer.
    assert "--mount=type=secret,id=pip.conf" in text and "--mount=type=secret,id=ca.pem" in text
    assert not re.search(r"^(COPY|ADD) .*(pip\.conf|\.pem|\.crt)", text, re.M)
    # KFP (and kfp.local's DockerRunner) set the command to `sh -ec ...`: no ENTRYPOINT.
    assert not re.search(r"^ENTRYPOINT", text, re.M)


def test_training_image_has_a_c_toolchain_and_the_gpu_stack():
    """Triton (vLLM) and torch.compile compile kernels' launchers at the first model load."""
    text = (ROOT / "docker" / "Dockerfile.train").read_text()
    assert re.search(r'packages="gcc g\+\+ libc6-dev"', text)
    assert "python3-dev" in text  # Python's headers where the base lacks them
    assert '".[train,pipeline,benchmark,gpu]"' in text


def test_one_version_of_every_package_for_every_install():
    """requirements/constraints.txt resolves the CPU path and the CUDA image together: vLLM's
    pins (vLLM 0.31.0: transformers < 5.18) are the project's pins."""
    pins = dict(
        line.split("==")
        for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    project = (ROOT / "pyproject.toml").read_text()
    for name in ("vllm", "transformers", "trl", "deepspeed"):
        assert f'"{name}=={pins[name]}' in project or f"{name}=={pins[name]}" in project, name
    assert pins["torch"] == "2.13.0"


def test_image_references_come_from_one_place():
    makefile = (ROOT / "Makefile").read_text()
    assert "grail.core.images" in makefile
    assert IMAGE.endswith(":0.1.0") and TRAIN_IMAGE.endswith(":0.1.0")
    pipeline = (ROOT / "pipelines" / "dag.py").read_text()
    assert "from grail.core.images import IMAGE, TRAIN_IMAGE" in pipeline
    assert "ghcr.io" not in pipeline


def test_check_images_reads_what_each_dockerfile_installs(monkeypatch):
    """`make check-images` resolves the sets the Dockerfiles really install (their pip lines)."""
    monkeypatch.syspath_prepend(str(ROOT / "docker"))
    import check_images

    assert check_images.requirements("Dockerfile") == ["torch==2.13.0", ".[cpu,server]"]
    assert check_images.requirements("Dockerfile.train") == [
        "torch==2.13.0",
        ".[train,pipeline,benchmark,gpu]",
    ]


def _pins() -> dict[str, str]:
    lines = (ROOT / "requirements" / "constraints.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def test_check_images_refuses_a_vllm_outside_trls_supported_range(monkeypatch):
    """TRL declares its supported vLLM range in its `vllm` extra (and only warns at import
    outside it): check-images makes it an error. The previous pins (vLLM 0.32.0 with TRL
    1.16.0) fail; the current ones pass. TRL's metadata is the installed TRL's own."""
    from importlib.metadata import distribution

    monkeypatch.syspath_prepend(str(ROOT / "docker"))
    import check_images

    trl = distribution("trl")
    pins = _pins()
    assert trl.version == pins["trl"]
    resolved = {
        "trl": {"version": trl.version, "requires_dist": trl.requires},
        "transformers": {"version": "5.19.0", "requires_dist": []},
        "vllm": {"version": "0.32.0", "requires_dist": []},
    }
    assert check_images.out_of_range(resolved) == [
        'trl==1.16.0 declares vllm<=0.31.0,>=0.22.0 (extra == "vllm"); vllm==0.32.0 resolved'
    ]
    resolved["vllm"]["version"] = pins["vllm"]
    resolved["transformers"]["version"] = pins["transformers"]
    assert check_images.out_of_range(resolved) == []
    # a local version (a CUDA build's "+cu130") is compared by its release, as TRL does
    resolved["vllm"]["version"] = pins["vllm"] + "+cu130"
    assert check_images.out_of_range(resolved) == []


def test_the_cuda_set_installs_trl_through_its_vllm_extra():
    """So that pip itself enforces TRL's vLLM range when the training image is built."""
    project = (ROOT / "pyproject.toml").read_text()
    gpu = re.search(r"^gpu = \[(.*)\]", project, re.M).group(1)
    pin = _pins()["trl"]
    assert f'"trl[vllm]=={pin}"' in gpu
