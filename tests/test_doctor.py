"""grail doctor: a readable checklist, non-zero when something is missing."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ports import free_port

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
