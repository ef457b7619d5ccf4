#!/usr/bin/env bash
# The whole DAG with kfp.local's DockerRunner in the locally built image, through a Docker API
# socket: Docker's own, or `podman system service` on a private socket for this run.
#   docker/dag-in-containers.sh GRAIL IMAGE OUTPUTS
set -euo pipefail
grail=$1 image=$2 outputs=$3
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    exec "$grail" run --local --runner docker --image "$image" --outputs "$outputs"
fi
socket=$(mktemp -u /tmp/grail-podman-XXXXXX.sock)
podman system service --time=0 "unix://$socket" &
service=$!
trap 'kill $service 2>/dev/null || true; rm -f "$socket"' EXIT
for _ in $(seq 50); do [ -S "$socket" ] && break; sleep 0.2; done
DOCKER_HOST="unix://$socket" "$grail" run --local --runner docker --image "$image" --outputs "$outputs"
