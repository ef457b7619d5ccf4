#!/usr/bin/env bash
# The whole DAG with kfp.local's DockerRunner in the locally built image. grail finds the Docker
# API itself: DOCKER_HOST, Docker's socket, or a podman service it starts for the run.
# One issue, as `make demo` runs it, on a fifth of its study (300 participants) and 100
# benchmarked rows: every component runs in the image, on less data (the demo's own figures are
# checked by the integration tier's local run, tests/test_pipeline.py). The second issue's
# branches would run the same tasks again (about two minutes of CI for nothing new); the whole
# study cost about 40 s more (cloning 54 s against 34 s, each benchmark 26 s against 12 s).
#   docker/dag-in-containers.sh GRAIL IMAGE OUTPUTS
set -euo pipefail
grail=$1 image=$2 outputs=$3
exec "$grail" run --local --runner docker --image "$image" --outputs "$outputs" --issues gun_control \
    --participants 300 --benchmark-limit 100
