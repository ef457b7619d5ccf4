"""The cluster overlays under k8s/overlays rendered with `kubectl kustomize` (the venv's kubectl),
from a copy whose secret env files are the committed examples; shared by tests/test_k8s.py and
tests/test_k8s_rbac.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BASE_OVERLAYS = [
    f"{pool}-{mode}" for pool in ("gke-h100", "eks-h100") for mode in ("standalone", "multi-user")
]
# Each overlay again with the optional components added the way docs/cluster/kubeflow.md says
# (the user's overlay lists them under `components:`): "gke-h100-standalone+reader".
COMPONENTS = ["reader"]
OVERLAYS = BASE_OVERLAYS + [f"{o}+{c}" for o in BASE_OVERLAYS for c in COMPONENTS]
# Where KFP runs pipeline pods in each mode, and as which service account.
NAMESPACES = {"standalone": "kubeflow", "multi-user": "kubeflow-user-example-com"}
RUNNERS = {"standalone": "pipeline-runner", "multi-user": "default-editor"}


def mode(overlay: str) -> str:
    """gke-h100-multi-user -> multi-user; gke-h100-standalone+reader -> standalone"""
    return overlay.split("+")[0].split("-", 2)[2]


def render(tmp: Path) -> dict[str, Path]:
    """Each overlay's `kubectl kustomize` output, written under `tmp`."""
    tree = tmp / "k8s"
    shutil.copytree(ROOT / "k8s", tree, ignore=shutil.ignore_patterns("*.env"))
    for example in (tree / "base" / "secrets").glob("*.env.example"):
        shutil.copyfile(example, example.with_suffix(""))
    out = {}
    for overlay in OVERLAYS:
        base, _, component = overlay.partition("+")
        folder = tree / "overlays" / overlay
        if component:  # the user's overlay: theirs, with the component added
            folder.mkdir()
            (folder / "kustomization.yaml").write_text(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                f"resources: [../{base}]\ncomponents: [../../components/{component}]\n"
            )
        done = subprocess.run(
            [str(BIN / "kubectl"), "kustomize", str(folder)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        out[overlay] = tmp / f"{overlay}.yaml"
        out[overlay].write_text(done.stdout)
    return out


def objects(path: Path) -> list[dict]:
    return [o for o in yaml.safe_load_all(path.read_text()) if o]
