"""Resolve each image's complete requirement set with pip, as its Dockerfile installs it.

    python docker/check_images.py            # both images; exit 1 on any conflict
    python docker/check_images.py --lock     # resolve every set together, print constraints

Each image's set is read from its Dockerfile (``torch==X`` and the ``".[extras]"`` it installs)
and resolved with ``pip install --dry-run --report`` against requirements/constraints.txt, the
constraints the Dockerfiles use, from this machine's package sources (docker/pip_sources.py).
The CUDA set is resolved without find-links, so that torch is PyPI's CUDA build (a local CPU
wheel would hide its pins: triton, nvidia-*). ``--lock`` resolves the CPU path, the dev tools
and the CUDA set together: ``make lock`` writes that as requirements/constraints.txt.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.version import Version
from pip_sources import environment

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
IMAGES = {
    # image: (Dockerfile, does pip see find-links (the CPU torch wheel here), must contain)
    "cpu": ("Dockerfile", True, ("torch", "transformers", "trl", "kfp", "mlflow")),
    "train": ("Dockerfile.train", False, ("torch", "transformers", "trl", "vllm", "deepspeed")),
}
LOCK_SET = ["torch==2.13.0", ".[cpu,server,dev,gpu,real-model]"]
HEADER = """\
# Pinned versions for every install: the venv (Makefile, CI), the CPU image and the CUDA training
# image, resolved together with torch's CUDA build (vLLM's and torch's own pins included):
# pip install -c requirements/constraints.txt. Regenerate: make lock. Checked by: make check-images.
"""


def requirements(dockerfile: str) -> list[str]:
    """``torch==X`` and the project extras a Dockerfile's pip installs name."""
    text = (ROOT / "docker" / dockerfile).read_text()
    found = re.findall(r"\btorch==[\w.]+", text)[:1]
    found += [f".[{extras}]" for extras in re.findall(r'"\.\[([\w,]+)\]"', text)]
    if not found:
        sys.exit(f"docker/{dockerfile}: no pip requirements found")
    return found


def resolve(wanted: list[str], find_links: bool, constrained: bool = True) -> dict[str, dict]:
    """name -> metadata of what pip would install, or exit 1 with pip's explanation."""
    with tempfile.TemporaryDirectory(prefix="grail-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
        command += ["--quiet", "--report", str(report)]
        command += ["-c", str(CONSTRAINTS)] if constrained else []
        done = subprocess.run(
            [*command, *wanted],
            cwd=ROOT,
            env=environment(find_links=find_links),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print(done.stdout[-3000:] + done.stderr[-6000:], file=sys.stderr)
            sys.exit(f"pip cannot resolve {' '.join(wanted)}")
        installs = json.loads(report.read_text())["install"]
    return {p["metadata"]["name"].lower().replace("_", "-"): p["metadata"] for p in installs}


# Extras whose declared ranges the images rely on though no Dockerfile names them: TRL's `vllm`
# extra holds its supported vLLM range (TRL warns at import outside it; here it is an error).
EXTRAS_RELIED_ON = {"trl": ("vllm",)}


def out_of_range(resolved: dict[str, dict]) -> list[str]:
    """Each declared requirement that a resolved set breaks: a package's own dependencies, and
    the ranges in :data:`EXTRAS_RELIED_ON`, checked against the versions resolved with it."""
    broken = []
    for name, metadata in sorted(resolved.items()):
        for line in metadata.get("requires_dist") or []:
            wanted = Requirement(line)
            other = wanted.name.lower().replace("_", "-")
            if other not in resolved:
                continue
            extras = ("", *EXTRAS_RELIED_ON.get(name, ()))
            if wanted.marker and not any(wanted.marker.evaluate({"extra": e}) for e in extras):
                continue
            version = Version(resolved[other]["version"])
            if not wanted.specifier.contains(Version(version.public), prereleases=True):
                broken.append(
                    f"{name}=={metadata['version']} declares {wanted.name}{wanted.specifier}"
                    f"{' (' + str(wanted.marker) + ')' if wanted.marker else ''}; "
                    f"{other}=={resolved[other]['version']} resolved"
                )
    return broken


def check() -> None:
    print(f"{'image':6} {'packages':>8}  key versions")
    for image, (dockerfile, find_links, needed) in IMAGES.items():
        resolved = resolve(requirements(dockerfile), find_links)
        missing = [name for name in needed if name not in resolved]
        if missing:
            sys.exit(f"{image}: {', '.join(missing)} not in the resolved set")
        if image == "train" and not any(n.startswith("nvidia-") for n in resolved):
            sys.exit("train: torch resolved without its CUDA libraries (a CPU build?)")
        broken = out_of_range(resolved)
        if broken:
            sys.exit(f"{image}: outside a declared range:\n  " + "\n  ".join(broken))
        versions = " ".join(f"{n}=={resolved[n]['version']}" for n in needed)
        print(f"{image:6} {len(resolved):>8}  {versions}")


def lock() -> None:
    resolved = resolve(LOCK_SET, find_links=False, constrained=False)
    pins = {n: m["version"].split("+")[0] for n, m in resolved.items() if n != "grail-pipeline"}
    sys.stdout.write(HEADER + "".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lock", action="store_true", help="print a new constraints file")
    if parser.parse_args().lock:
        lock()
    else:
        check()


if __name__ == "__main__":
    main()
