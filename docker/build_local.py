"""Build grail's images on this machine with whatever container engine it has.

    python docker/build_local.py [--image cpu|train] [--tag localhost/grail:dev] [--base IMAGE]

- Engine: Docker when its daemon answers, else podman (Debian's podman/buildah with runc).
- Base image: ``--base`` (default ``python:3.11.11-slim-bookworm``). When no registry can serve
  it (an offline or mirrored site), a Debian bookworm base with Python is made from Debian
  packages with debootstrap (from the apt mirror this machine uses) and imported as
  ``localhost/grail-base:bookworm``; later builds reuse it.
- Package sources: the build uses this machine's pip configuration (index, extra indexes and,
  for the CPU image, find-links; a local folder index is mounted read-only for the build) and CA
  bundle, passed as build secrets, so a site behind a mirror or a TLS-intercepting proxy builds
  the same image as everyone else. Nothing of them is written into a layer.

Standard library and pip only: it runs before grail is installed.
"""

from __future__ import annotations

import argparse
import configparser
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from check_images import IMAGES
from pip_sources import ca_bundle, local_folders, settings

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_BASE = "python:3.11.11-slim-bookworm"
LOCAL_BASE = "localhost/grail-base:bookworm"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, check=True, **kwargs)


def works(command: list[str], timeout: float = 60) -> bool:
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def engine() -> str:
    """``docker`` when a Docker daemon answers, else ``podman``."""
    if shutil.which("docker") and works(["docker", "info"], timeout=20):
        return "docker"
    if shutil.which("podman"):
        return "podman"
    sys.exit("no container engine: install Docker, or podman/buildah/runc (make container-engine)")


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb.debian.org when none is found)."""
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            words = line.split()
            uri = words[1] if words[:1] == ["deb"] and len(words) > 1 else None
            uri = words[1] if words[:1] == ["URIs:"] and len(words) > 1 else uri
            if uri and uri.rstrip("/").endswith("/debian"):
                return uri
    return "http://deb.debian.org/debian"


def base_image(tool: str, wanted: str) -> str:
    """`wanted` if present or pullable, else the debootstrapped local base (built once)."""
    if works([tool, "image", "inspect", wanted]) or works([tool, "pull", wanted], timeout=120):
        return wanted
    if works([tool, "image", "inspect", LOCAL_BASE]):
        print(f"{wanted} cannot be pulled: using {LOCAL_BASE}", flush=True)
        return LOCAL_BASE
    print(f"{wanted} cannot be pulled: building {LOCAL_BASE} with debootstrap", flush=True)
    with tempfile.TemporaryDirectory(prefix="grail-base-") as tmp:
        tree = Path(tmp) / "rootfs"
        run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-venv,ca-certificates",
                "bookworm",
                str(tree),
                apt_mirror(),
            ]
        )
        shutil.rmtree(tree / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        shutil.rmtree(tree / "var" / "lib" / "apt" / "lists", ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(tree), "-c", "."], stdout=subprocess.PIPE)
        run([tool, "import", "-", LOCAL_BASE], stdin=tar.stdout)
        tar.wait()
    return LOCAL_BASE


def torch_index() -> str:
    """The public CPU-torch index when it answers; "" (the pip configuration's sources, whose
    find-links may hold the CPU wheel) when it does not."""
    import ssl
    import urllib.request

    context = ssl.create_default_context(cafile=ca_bundle())
    try:
        urllib.request.urlopen(f"{TORCH_INDEX}/torch/", timeout=10, context=context)
        return TORCH_INDEX
    except OSError:
        print(f"{TORCH_INDEX} does not answer: torch comes from the pip configuration", flush=True)
        return ""


# Free space a build needs: the image, plus its largest layer (torch) staged again in the
# engine's storage and temporary folder while it is committed.
NEEDED_GB = {"cpu": 6, "train": 16}


def check_disk(tool: str, needed: float) -> None:
    """Refuse, in one line, a build whose engine storage or temporary folder is nearly full:
    podman otherwise fails minutes in with "io: read/write on closed pipe" while committing."""
    where = "/var/lib/docker" if tool == "docker" else "/var/lib/containers/storage"
    if tool == "podman":  # its storage root as configured (one `podman info`)
        asked = ["podman", "info", "--format", "{{.Store.GraphRoot}}"]
        done = subprocess.run(asked, capture_output=True, text=True, timeout=60)
        where = (done.returncode == 0 and done.stdout.strip()) or where
    for folder in (where, tempfile.gettempdir()):
        path = Path(folder)
        while not path.exists() and path != path.parent:
            path = path.parent
        free = shutil.disk_usage(path).free / 1e9
        if free < needed:
            sys.exit(
                f"{folder}: {free:.1f} GB free; building the {tool} image needs about "
                f"{needed} GB there (free space, e.g. `{tool} image prune`, then rebuild)"
            )


def build(image: str, tag: str, base: str, version: str) -> None:
    tool = engine()
    check_disk(tool, NEEDED_GB[image])
    base = base_image(tool, base)
    dockerfile, find_links, _ = IMAGES[image]
    found = settings(find_links)
    with tempfile.TemporaryDirectory(prefix="grail-pip-") as tmp:
        config = configparser.ConfigParser()
        config["global"] = found
        pip_conf = Path(tmp) / "pip.conf"
        with pip_conf.open("w") as handle:
            config.write(handle)
        command = [tool, "build", "-f", str(ROOT / "docker" / dockerfile), "-t", tag]
        command += ["--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"VERSION={version}"]
        if image == "cpu":
            command += ["--build-arg", f"TORCH_INDEX_URL={torch_index()}"]
        command += ["--secret", f"id=pip.conf,src={pip_conf}"]
        if ca_bundle():
            command += ["--secret", f"id=ca.pem,src={ca_bundle()}"]
        if tool == "podman":
            # Rootful podman here: chroot isolation (runc isolation cannot set RLIMIT_NPROC),
            # the host network for pip, and the local package folders read-only.
            command += ["--isolation", "chroot", "--network", "host", "--layers"]
            for folder in local_folders(found):
                command += ["-v", f"{folder}:{folder}:ro"]
        run([*command, str(ROOT)])
    print(f"built {tag} from {base}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", choices=sorted(IMAGES), default="cpu")
    parser.add_argument("--tag", default="localhost/grail:dev")
    parser.add_argument("--base", default=PUBLIC_BASE, help=f"base image (default {PUBLIC_BASE})")
    parser.add_argument("--version", default="dev")
    args = parser.parse_args()
    build(args.image, args.tag, args.base, args.version)


if __name__ == "__main__":
    main()
