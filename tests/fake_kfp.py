"""A fake KFP API server on 127.0.0.1 that records what `kfp.Client` sends (v2beta1 REST)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from ports import answer_json


class FakeKfp:
    """Answers healthz, experiment look-up/creation and run creation; keeps every request."""

    def __init__(self):
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, body: dict, status: int = 200):
                answer_json(self, body, status)

            def _record(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                url = urlsplit(self.path)
                fake.requests.append(
                    {
                        "method": self.command,
                        "path": url.path,
                        "query": parse_qs(url.query),
                        "headers": dict(self.headers),
                        "body": json.loads(raw) if raw else None,
                    }
                )
                return url.path, fake.requests[-1]["body"]

            def do_GET(self):
                path, _ = self._record()
                if path.endswith("/healthz"):
                    self._answer({"multi_user": False})
                elif path.endswith("/experiments"):
                    self._answer({"experiments": [], "total_size": 0})
                else:
                    self._answer({"error": "not found"}, 404)

            def do_POST(self):
                path, body = self._record()
                if path.endswith("/experiments"):
                    self._answer({"experiment_id": "exp-1", **body})
                elif path.endswith("/runs"):
                    self._answer({"run_id": "run-1", "state": "PENDING", **body})
                else:
                    self._answer({"error": "not found"}, 404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeKfp:
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
