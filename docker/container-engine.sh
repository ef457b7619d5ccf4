#!/usr/bin/env bash
# A container engine for `make images-local` / `make test-containers` on a machine without Docker:
# Debian's podman, buildah, runc and debootstrap, configured for this kind of machine (as root).
# - crun (podman's default runtime) fails here ("cgroups in hybrid mode not supported"): runc.
# - podman's default rlimits (nofile 1048576) exceed the hard limits a container may raise to
#   without CAP_SYS_RESOURCE: default to the current hard nofile limit and 32768 processes.
# With a Docker daemon that answers, nothing is done.
set -euo pipefail
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    echo "Docker engine answers: using it"; exit 0
fi
if ! command -v podman >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        echo "podman/debootstrap missing: install them (apt-get install podman buildah runc debootstrap) as root" >&2
        exit 1
    fi
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        podman buildah runc debootstrap uidmap ca-certificates
fi
conf=/etc/containers/containers.conf
if [ "$(id -u)" = 0 ] && ! grep -q "written by grail" "$conf" 2>/dev/null; then
    if [ -s "$conf" ]; then
        echo "$conf exists: leaving it as it is (needs runtime = \"runc\" and lower ulimits here)" >&2
    else
        mkdir -p /etc/containers
        cat > "$conf" <<CONF
# written by grail's docker/container-engine.sh
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=32768:32768"]

[engine]
runtime = "runc"
CONF
    fi
fi
podman info --format '{{.Host.OCIRuntime.Name}}' >/dev/null
echo "podman $(podman --version | awk '{print $3}') ready"
