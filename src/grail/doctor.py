"""Preflight for a cluster run: ``grail doctor [--namespace grail] [--kfp-host URL]``.

Checks with the Kubernetes Python client (kubeconfig, or in-cluster credentials) what a run needs:
the namespace, the secrets by name, nodes with the GPU pool's labels and allocatable GPUs (from
the ``grail-gpu-pool`` ConfigMap the overlays set), and that the KFP API and the MLflow server
answer. Prints a checklist; exits non-zero when something is missing.
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass

SECRETS = ("grail-s3", "grail-mlflow", "grail-openai")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"[{'ok' if self.ok else 'MISSING'}] {self.name}: {self.detail}"


def _reachable(name: str, url: str) -> Check:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return Check(name, True, f"{url} answered {reply.status}")
    except OSError as err:
        return Check(name, False, f"{url} did not answer ({getattr(err, 'reason', err)})")


def kubernetes_client():
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoreV1Api()


def gpu_nodes(api, selector: dict[str, str], gpu_type: str) -> Check:
    label_selector = ",".join(f"{k}={v}" for k, v in selector.items())
    nodes = api.list_node(label_selector=label_selector or None, _request_timeout=10).items
    gpus = {n.metadata.name: int((n.status.allocatable or {}).get(gpu_type, "0")) for n in nodes}
    with_gpus = {name: count for name, count in gpus.items() if count > 0}
    where = f"nodes matching {selector or 'any labels'}"
    if not with_gpus:
        return Check("GPU nodes", False, f"no {where} with allocatable {gpu_type}")
    return Check(
        "GPU nodes",
        True,
        f"{len(with_gpus)} {where}, {sum(with_gpus.values())} {gpu_type} allocatable",
    )


def cluster_checks(namespace: str, secrets: tuple[str, ...]) -> list[Check]:
    from kubernetes.client.exceptions import ApiException

    try:
        api = kubernetes_client()
        api.read_namespace(namespace, _request_timeout=10)
    except ApiException as err:
        return [Check("namespace", False, f"{namespace}: {err.reason}")]
    except Exception as err:  # noqa: BLE001 - no kubeconfig, no route: one readable line
        return [Check("kubernetes API", False, f"cannot reach the cluster ({err})")]
    checks = [Check("namespace", True, namespace)]
    for secret in secrets:
        try:
            api.read_namespaced_secret(secret, namespace, _request_timeout=10)
            checks.append(Check(f"secret {secret}", True, "present"))
        except ApiException as err:
            checks.append(Check(f"secret {secret}", False, err.reason or "not found"))
    try:
        pool = api.read_namespaced_config_map("grail-gpu-pool", namespace).data
        checks.append(gpu_nodes(api, json.loads(pool["node_selector"]), pool["gpu_type"]))
    except ApiException:
        checks.append(gpu_nodes(api, {}, "nvidia.com/gpu"))
    return checks


def doctor(
    namespace: str = "grail",
    kfp_host: str | None = None,
    mlflow_uri: str | None = None,
    secrets: tuple[str, ...] = SECRETS,
) -> list[Check]:
    """Every check, in order."""
    checks = cluster_checks(namespace, secrets)
    kfp_host = kfp_host or os.environ.get("KFP_HOST")
    checks.append(
        _reachable("KFP API", f"{kfp_host.rstrip('/')}/apis/v2beta1/healthz")
        if kfp_host
        else Check("KFP API", False, "no --kfp-host (or KFP_HOST) given")
    )
    mlflow_uri = mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
    checks.append(
        _reachable("MLflow server", f"{mlflow_uri.rstrip('/')}/health")
        if mlflow_uri and mlflow_uri.startswith("http")
        else Check("MLflow server", False, "no http MLFLOW_TRACKING_URI given")
    )
    return checks
