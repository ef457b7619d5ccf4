"""Cluster manifests: every overlay renders (kubectl kustomize), validates against the Kubernetes
schemas, runs every pod under Pod Security "restricted", and passes checkov."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
OVERLAYS = ["gke-h100", "eks-h100"]
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Path]:
    """Each overlay rendered from a copy whose secret env files are the committed examples."""
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(ROOT / "k8s", tree, ignore=shutil.ignore_patterns("*.env"))
    for example in (tree / "base" / "secrets").glob("*.env.example"):
        shutil.copyfile(example, example.with_suffix(""))
    out = {}
    for overlay in OVERLAYS:
        done = subprocess.run(
            [str(BIN / "kubectl"), "kustomize", str(tree / "overlays" / overlay)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        out[overlay] = tree / f"{overlay}.yaml"
        out[overlay].write_text(done.stdout)
    return out


def _objects(path: Path) -> list[dict]:
    return [o for o in yaml.safe_load_all(path.read_text()) if o]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates(rendered, overlay):
    kinds = {(o["kind"], o["metadata"]["name"]) for o in _objects(rendered[overlay])}
    for expected in [
        ("Namespace", "grail"),
        ("ServiceAccount", "grail-pipeline"),
        ("Role", "grail-pipeline"),
        ("RoleBinding", "grail-pipeline"),
        ("Deployment", "mlflow"),
        ("StatefulSet", "mlflow-postgres"),
        ("ConfigMap", "kfp-launcher"),
        ("ConfigMap", "grail-gpu-pool"),
        ("Secret", "grail-s3"),
        ("Secret", "grail-mlflow"),
        ("Secret", "grail-openai"),
    ]:
        assert expected in kinds, expected
    done = subprocess.run(
        [str(BIN / "kubernetes-validate"), "-k", "1.37.0", "--strict", str(rendered[overlay])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_restricted_with_requests_and_limits(rendered, overlay):
    pods = [
        o["spec"]["template"]["spec"]
        for o in _objects(rendered[overlay])
        if o["kind"] in ("Deployment", "StatefulSet")
    ]
    assert pods
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert set(container["resources"]) == {"requests", "limits"}
    namespace = next(o for o in _objects(rendered[overlay]) if o["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_overlays_choose_their_gpu_pool(rendered):
    pools = {
        name: next(o for o in _objects(path) if o["metadata"]["name"] == "grail-gpu-pool")
        for name, path in rendered.items()
    }
    assert "cloud.google.com/gke-accelerator" in pools["gke-h100"]["data"]["node_selector"]
    assert "p5.48xlarge" in pools["eks-h100"]["data"]["node_selector"]
    assert pools["eks-h100"]["data"]["gpu_count"] == "8"


def test_secret_values_stay_out_of_git():
    env_files = list((ROOT / "k8s" / "base" / "secrets").glob("*.env.example"))
    assert len(env_files) == 4
    for example in env_files:
        target = example.with_suffix("")
        ignored = subprocess.run(["git", "check-ignore", "-q", str(target)], cwd=ROOT)
        assert ignored.returncode == 0, f"{target} must be git-ignored"


def test_checkov_passes_on_k8s_and_docker(rendered, tmp_path):
    assert CHECKOV.exists(), "checkov lives in its own venv: run `make checkov`"
    for overlay, path in rendered.items():
        done = subprocess.run(
            [
                str(CHECKOV),
                "--quiet",
                "--compact",
                "--skip-download",
                "--framework",
                "kubernetes",
                "-f",
                str(path),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"{overlay}:\n{done.stdout[-4000:]}"
    done = subprocess.run(
        [
            str(CHECKOV),
            "--quiet",
            "--compact",
            "--skip-download",
            "--framework",
            "dockerfile",
            "-d",
            str(ROOT / "docker"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:]
