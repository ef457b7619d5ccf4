"""grail doctor: a readable checklist, non-zero when something is missing."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ports import answer_json, free_port

from grail.cli import main


class Healthy(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.send_response(200 if self.path.endswith(("/healthz", "/health")) else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_without_a_cluster_every_missing_piece_is_listed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KFP_HOST", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["doctor"]) == 2
    out, err = capsys.readouterr()
    assert "[MISSING] kubernetes API: cannot reach the cluster" in out
    assert "[MISSING] KFP API: no --kfp-host" in out
    assert "[MISSING] MLflow server" in out
    assert "3 of 3 checks failed" in err


def test_reachable_endpoints_pass_and_dead_ones_fail(tmp_path, monkeypatch, capsys):
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    try:
        assert (
            main(["doctor", "--kfp-host", url, "--mlflow-uri", f"http://127.0.0.1:{free_port()}"])
            == 2
        )
    finally:
        server.shutdown()
    out = capsys.readouterr().out
    assert f"[ok] KFP API: {url}/apis/v2beta1/healthz answered 200" in out
    assert "[MISSING] MLflow server: http://127.0.0.1:" in out


class FakeCluster(BaseHTTPRequestHandler):
    """A Kubernetes API (the paths `grail doctor` reads) and an MLflow server that, like MLflow
    >= 3.5 without --allowed-hosts, answers /health but refuses API calls (403)."""

    objects: dict[str, dict] = {}

    def do_GET(self):  # noqa: N802 (http.server's naming)
        path = self.path.split("?")[0]
        if path == "/health":
            body, status = {}, 200
        elif path.startswith("/api/2.0/mlflow/"):
            body, status = {"error": "Invalid Host header"}, 403
        elif path in self.objects:
            body, status = self.objects[path], 200
        else:
            body = {"kind": "Status", "apiVersion": "v1", "reason": "NotFound", "code": 404}
            status = 404
        answer_json(self, body, status)

    def log_message(self, *args):
        pass


def _node(name: str, gpus: str, labels: dict | None = None) -> dict:
    """A node with `gpus` allocatable nvidia.com/gpu and `labels` (GPU feature discovery's)."""
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"allocatable": {"nvidia.com/gpu": gpus}},
    }


def _cluster(namespace: str, labels: dict, root: str, nodes: list | None = None) -> dict[str, dict]:
    ns = f"/api/v1/namespaces/{namespace}"
    meta = {"kind": "ConfigMap", "apiVersion": "v1"}
    return {
        ns: {
            "kind": "Namespace",
            "apiVersion": "v1",
            "metadata": {"name": namespace, "labels": labels},
        },
        f"{ns}/serviceaccounts/default-editor": {
            "kind": "ServiceAccount",
            "metadata": {"name": "default-editor"},
        },
        f"{ns}/secrets/grail-s3": {"kind": "Secret", "metadata": {"name": "grail-s3"}},
        f"{ns}/secrets/grail-mlflow": {"kind": "Secret", "metadata": {"name": "grail-mlflow"}},
        f"{ns}/configmaps/kfp-launcher": meta
        | {"metadata": {"name": "kfp-launcher"}, "data": {"defaultPipelineRoot": root}},
        f"{ns}/configmaps/grail-gpu-pool": meta
        | {
            "metadata": {"name": "grail-gpu-pool"},
            "data": {"gpu_type": "nvidia.com/gpu", "node_selector": '{"pool": "h100"}'},
        },
        "/api/v1/nodes": {
            "kind": "NodeList",
            "apiVersion": "v1",
            "metadata": {},
            "items": nodes or [_node("gpu-1", "8")],
        },
    }


@pytest.fixture
def cluster_url(tmp_path, monkeypatch):
    """FakeCluster served on a free port, the kubeconfig pointing at it; its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeCluster)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    (tmp_path / "kubeconfig").write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": url}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    yield url
    server.shutdown()


def test_multi_user_prerequisites_are_checked_against_the_cluster(cluster_url, capsys):
    namespace, url = "team-a", cluster_url
    good = {
        "app.kubernetes.io/part-of": "kubeflow-profile",
        "pod-security.kubernetes.io/enforce": "baseline",
    }
    args = ["doctor", "--mode", "multi-user", "--namespace", namespace, "--kfp-host", url]
    FakeCluster.objects = _cluster(
        namespace, good, f"minio://mlpipeline/private-artifacts/{namespace}/v2/artifacts"
    )
    assert main([*args, "--mlflow-uri", url]) == 2
    out = capsys.readouterr().out
    assert "[ok] namespace: team-a (Pod Security baseline)" in out
    assert "[ok] service account default-editor: present" in out
    assert "[ok] secret grail-s3: present" in out and "[MISSING] secret grail-openai" in out
    assert (
        "[ok] kfp-launcher ConfigMap: pipeline root minio://mlpipeline/private-artifacts/team-a/"
        in out
    )
    assert "[ok] GPU nodes: 1 nodes matching {'pool': 'h100'}, 8 nvidia.com/gpu allocatable" in out
    assert "[MISSING] MLflow server: " in out and "answered 403 (Invalid Host header" in out
    # A namespace that is not a Profile's, enforcing "restricted", with the standalone root:
    FakeCluster.objects = _cluster(
        namespace,
        {"pod-security.kubernetes.io/enforce": "restricted"},
        "minio://mlpipeline/v2/artifacts",
    )
    assert main(args) == 2
    out = capsys.readouterr().out
    assert "[MISSING] namespace: team-a enforces Pod Security restricted" in out
    assert "[MISSING] kfp-launcher ConfigMap: pipeline root minio://mlpipeline/v2/a" in out
    FakeCluster.objects = _cluster(namespace, {}, "")
    assert main(args) == 2
    assert "is not a Profile namespace" in capsys.readouterr().out


def test_gpu_nodes_with_too_old_a_driver_fail_and_unlabelled_ones_warn(cluster_url, capsys):
    namespace = "team-a"
    current = {
        "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/cuda.driver-version.full": "580.95.05",
    }
    old = {
        "nvidia.com/cuda.driver-version.major": "570",
        "nvidia.com/cuda.driver-version.full": "570.172.08",
    }
    legacy = {"nvidia.com/cuda.driver.major": "550"}  # an older GFD: the deprecated label alone
    args = ["doctor", "--mode", "multi-user", "--namespace", namespace, "--kfp-host", cluster_url]

    def doctor(nodes: list) -> tuple[str, str]:
        FakeCluster.objects = _cluster(namespace, {}, "", nodes)
        main(args)
        return capsys.readouterr()

    out, _ = doctor(
        [
            _node("gpu-1", "8", current),
            _node("gpu-2", "8", old),
            _node("gpu-3", "4", legacy),
            _node("cpu-1", "0", old),  # no GPUs: not the pool's concern
        ]
    )
    assert (
        "[MISSING] GPU driver: gpu-2 has NVIDIA driver 570.172.08, gpu-3 has NVIDIA driver 550; "
        "the training image's CUDA 13 wheels need 580 or newer\n"
    ) in out
    assert "[ok] GPU nodes: 3 nodes matching {'pool': 'h100'}, 20 nvidia.com/gpu" in out

    out, warned = doctor([_node("gpu-1", "8", current), _node("gpu-4", "8")])
    assert (
        "[warning] GPU driver: could not read the NVIDIA driver of gpu-4 "
        "(no nvidia.com/cuda.driver-version.major label: is GPU feature discovery running?); "
        "the training image's CUDA 13 wheels need 580 or newer\n"
    ) in out
    out, passed = doctor([_node("gpu-1", "8", current)])
    assert "[ok] GPU driver: 580 or newer on all 1 GPU nodes\n" in out
    assert warned == passed and "GPU driver" not in warned  # a warning fails nothing


def test_a_password_in_the_mlflow_uri_is_never_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    port = free_port()
    assert main(["doctor", "--mlflow-uri", f"http://ann:hunter2@127.0.0.1:{port}"]) == 2
    out, err = capsys.readouterr()
    assert "hunter2" not in out + err and "ann:***@127.0.0.1" in out
