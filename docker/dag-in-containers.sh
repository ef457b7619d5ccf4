#!/usr/bin/env bash
# The whole DAG with kfp.local's DockerRunner in the locally built image. grail finds the Docker
# API itself: DOCKER_HOST, Docker's socket, or a podman service it starts for the run.
# One issue, as `make demo` runs it: every component runs in the image; the second issue's
# branches would run the same tasks again (about two minutes of CI for nothing new).
#   docker/dag-in-containers.sh GRAIL IMAGE OUTPUTS
set -euo pipefail
grail=$1 image=$2 outputs=$3
exec "$grail" run --local --runner docker --image "$image" --outputs "$outputs" --issues gun_control
