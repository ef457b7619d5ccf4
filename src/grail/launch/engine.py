"""The container engine behind ``grail run --local --runner docker``.

kfp.local's DockerRunner talks to a Docker API through the docker SDK (``docker.from_env()``:
``DOCKER_HOST``, else Docker's socket). :func:`docker_api` finds one before the run starts:
``DOCKER_HOST`` when set, Docker's own socket, else podman, whose Docker-compatible API
(``podman system service``) is started on a private socket for the run and stopped after it.
With none, one line says what to install or set.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from grail.core.errors import GrailError

DOCKER_SOCKET = "/var/run/docker.sock"
NO_ENGINE = (
    "--runner docker needs a container engine: install Docker or podman, or set DOCKER_HOST "
    "to a Docker API socket"
)


def why_unreachable(host: str) -> str | None:
    """None when a Docker API answers at `host`, else why not (one line)."""
    import docker

    try:
        client = docker.DockerClient(base_url=host, timeout=5)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as error:  # the SDK wraps connection errors in several types
        return (str(error).strip().splitlines() or [type(error).__name__])[-1][:200]
    return None


@contextmanager
def podman_service(podman: str, wait: float = 20.0):
    """``podman system service`` on a private socket while the block runs; yields its
    ``unix://`` address, then stops the service."""
    folder = Path(tempfile.mkdtemp(prefix="grail-podman-"))
    socket = folder / "docker.sock"
    log = (folder / "service.log").open("w")
    service = subprocess.Popen(
        [podman, "system", "service", "--time=0", f"unix://{socket}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    host = f"unix://{socket}"
    try:
        deadline = time.monotonic() + wait
        while not (socket.exists() and why_unreachable(host) is None):
            if service.poll() is not None or time.monotonic() > deadline:
                said = (folder / "service.log").read_text().strip().splitlines()
                raise GrailError(
                    "podman system service did not start"
                    + (f": {said[-1]}" if said else f" within {wait:.0f} s")
                )
            time.sleep(0.2)
        yield host
    finally:
        service.terminate()
        try:
            service.wait(timeout=10)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def check_image(host: str, image: str) -> None:
    """A ``localhost/`` image (built here, never pulled) must be in the engine."""
    import docker

    if not image.startswith("localhost/"):
        return  # kfp.local pulls a registry image the engine lacks
    client = docker.DockerClient(base_url=host, timeout=30)
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise GrailError(
            f"image {image} is not in the container engine at {host}: build it with "
            "make images-local"
        ) from None
    finally:
        client.close()


@contextmanager
def docker_api(image: str | None = None, environ: dict | None = None, podman: str | None = None):
    """Yields the ``DOCKER_HOST`` a run uses (see the module's docstring); checks `image` is
    there when it can only have been built locally. `environ` and `podman` (the podman
    executable, default: found on PATH) are for tests."""
    import os

    environ = os.environ if environ is None else environ
    podman = podman if podman is not None else shutil.which("podman")
    host = environ.get("DOCKER_HOST")
    if host:
        why = why_unreachable(host)
        if why:
            raise GrailError(f"DOCKER_HOST={host}: no Docker API answers there ({why})")
        found = nullcontext(host)
    elif Path(DOCKER_SOCKET).is_socket() and why_unreachable(f"unix://{DOCKER_SOCKET}") is None:
        found = nullcontext(f"unix://{DOCKER_SOCKET}")
    elif podman:
        found = podman_service(podman)
    else:
        raise GrailError(NO_ENGINE)
    with found as host:
        if image:
            check_image(host, image)
        yield host
