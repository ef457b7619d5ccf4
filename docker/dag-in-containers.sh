#!/usr/bin/env bash
# The whole DAG with kfp.local's DockerRunner in the locally built image. grail finds the Docker
# API itself: DOCKER_HOST, Docker's socket, or a podman service it starts for the run.
#   docker/dag-in-containers.sh GRAIL IMAGE OUTPUTS
set -euo pipefail
grail=$1 image=$2 outputs=$3
exec "$grail" run --local --runner docker --image "$image" --outputs "$outputs"
