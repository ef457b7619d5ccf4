#!/usr/bin/env bash
# `make test-image-train`: docker/check_train_image.py in the CUDA training image, as uid 10001,
# without a GPU and without a network, on a read-only root (as the reader's pod runs it) with a
# fresh /tmp; the repository's docker/ and k8s/ mounted read-only under /checks.
#   bash docker/test-train-image.sh [IMAGE]     (default localhost/grail-train:dev)
set -euo pipefail
image=${1:-localhost/grail-train:dev}
root=$(cd "$(dirname "$0")/.." && pwd)
engine=podman
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then engine=docker; fi
exec "$engine" run --rm --user 10001:10001 --network none --read-only --tmpfs /tmp \
    -v "$root/docker:/checks/docker:ro" -v "$root/k8s:/checks/k8s:ro" --workdir /tmp \
    "$image" python /checks/docker/check_train_image.py
