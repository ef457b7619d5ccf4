"""moto's S3 server, as ``moto_server`` serves it but one request at a time: S3's rule for
conditional writes, which the stand-in otherwise breaks.

AWS S3 applies a conditional PutObject atomically: of two racing ``If-None-Match: *`` writes of
one key, one succeeds and the other gets 412 PreconditionFailed (or 409
ConditionalRequestConflict), and MinIO does the same. moto 5.2's ``put_object`` checks the
condition and then writes the object, and ``moto_server`` serves each request in a thread of
its own (``run_simple(..., threaded=True)`` in ``moto/server.py``), so two racing writes can
both pass the check and both succeed: the lease race of ``tests/test_lease.py`` found two
winners of one lease on CI (round 10 of 12, four processes) and here under load (1 round in
300). Served one request at a time, every conditional write is atomic, as on S3; each
response also closes its connection (werkzeug answers HTTP/1.0 without threads), so a client's
idle keep-alive connection never holds the server.

Run: ``python tests/s3_server.py HOST PORT`` (what ``moto_server -H HOST -p PORT`` runs, the
same application and request handler, without threads).
"""

from __future__ import annotations

import os
import sys

from moto.moto_server.threaded_moto_server import MotoRequestHandler
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple


def main(host: str, port: int) -> None:
    os.environ.setdefault("MOTO_PORT", str(port))  # as moto_server sets it
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, port, app, threaded=False, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
