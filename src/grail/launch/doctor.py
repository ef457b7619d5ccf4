"""Preflight for a cluster run: ``grail doctor [--mode standalone|multi-user] [--namespace NS]``.

Checks with the Kubernetes Python client (kubeconfig, or in-cluster credentials) what a run needs
in the namespace where KFP runs its pods: standalone KFP runs them in its own namespace
(``kubeflow``) as ``pipeline-runner``; multi-user KFP in the Profile's namespace as
``default-editor``. Then: the secrets by name, KFP's ``kfp-launcher`` ConfigMap (in multi-user
mode its pipeline root must be under the profile's ``private-artifacts/NAMESPACE/`` prefix), the
namespace's Pod Security level (``restricted`` rejects KFP 2.17 executor pods), nodes with the GPU
pool's labels and allocatable GPUs (from the ``grail-gpu-pool`` ConfigMap) and their NVIDIA driver
(GPU feature discovery's node labels: older than the training image's CUDA 13 wheels need fails,
unlabelled warns), that the KFP API answers, and that the MLflow server answers an API call
(``/health`` alone passes even when MLflow refuses every call for its Host header). Prints a
checklist; exits 2 when something is missing.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Literal

from grail.core.config import option
from grail.core.errors import mask_secrets

SECRETS = ("grail-s3", "grail-mlflow", "grail-openai")
MODES = {
    # mode: (default namespace, the service account KFP runs pipeline pods as)
    "standalone": ("kubeflow", "pipeline-runner"),
    "multi-user": ("kubeflow-user-example-com", "default-editor"),
}
PROFILE_LABEL = ("app.kubernetes.io/part-of", "kubeflow-profile")
# The oldest NVIDIA driver branch the training image's CUDA 13 wheels (torch's, vLLM's;
# cuda-bindings 13 in requirements/constraints.txt) run on: CUDA 13.0 needs R580.
MIN_DRIVER = 580
# GPU feature discovery's node labels for the driver: the current major label first, then the
# deprecated one, which older releases set alone
# (docs/pins.md#nvidia-drivers-and-gpu-feature-discovery).
DRIVER_MAJOR_LABELS = ("nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver.major")
DRIVER_FULL_LABEL = "nvidia.com/cuda.driver-version.full"


@dataclass
class Check:
    """One line of the checklist; a `warning` is a check that could not tell (it fails nothing)."""

    name: str
    ok: bool
    detail: str
    warning: bool = False

    def line(self) -> str:
        mark = "warning" if self.warning else "ok" if self.ok else "MISSING"
        return f"[{mark}] {self.name}: {self.detail}"


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
        # KUBECONFIG read now: the client reads it once, when first imported.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    return client.CoreV1Api()


def gpu_nodes(api, selector: dict[str, str], gpu_type: str) -> list[Check]:
    """The GPU pool's nodes with allocatable GPUs and, when there are some, their driver."""
    label_selector = ",".join(f"{k}={v}" for k, v in selector.items())
    nodes = api.list_node(label_selector=label_selector or None, _request_timeout=10).items
    with_gpus = {
        n.metadata.name: (count, n.metadata.labels or {})
        for n in nodes
        if (count := int((n.status.allocatable or {}).get(gpu_type, "0"))) > 0
    }
    where = f"nodes matching {selector or 'any labels'}"
    if not with_gpus:
        return [Check("GPU nodes", False, f"no {where} with allocatable {gpu_type}")]
    gpus = sum(count for count, _ in with_gpus.values())
    return [
        Check("GPU nodes", True, f"{len(with_gpus)} {where}, {gpus} {gpu_type} allocatable"),
        driver_check({name: labels for name, (_, labels) in with_gpus.items()}),
    ]


def node_driver(labels: dict[str, str]) -> tuple[int, str] | None:
    """A node's NVIDIA driver (major version, full version) from GPU feature discovery's labels;
    None where it set none.

    >>> node_driver({"nvidia.com/cuda.driver-version.major": "570",
    ...     "nvidia.com/cuda.driver-version.full": "570.124.06"})
    (570, '570.124.06')
    >>> node_driver({"nvidia.com/cuda.driver.major": "535"}), node_driver({})
    ((535, '535'), None)
    """
    major = next((labels[k] for k in DRIVER_MAJOR_LABELS if labels.get(k)), "")
    if not (major.isascii() and major.isdigit()):
        return None
    return int(major), labels.get(DRIVER_FULL_LABEL, major)


def driver_check(labels: dict[str, dict[str, str]]) -> Check:
    """Whether every GPU node (its labels by name) has an NVIDIA driver the training image's CUDA
    13 wheels run on; a node whose driver is not labelled is a warning.

    >>> check = driver_check({"gpu-1": {"nvidia.com/cuda.driver.major": "580"},
    ...     "gpu-2": {"nvidia.com/cuda.driver-version.major": "570"}})
    >>> check.ok, check.detail
    (False, "gpu-2 has NVIDIA driver 570; the training image's CUDA 13 wheels need 580 or newer")
    """
    drivers = {name: node_driver(node_labels) for name, node_labels in labels.items()}
    old = [
        f"{name} has NVIDIA driver {d[1]}" for name, d in drivers.items() if d and d[0] < MIN_DRIVER
    ]
    unread = [name for name, d in drivers.items() if d is None]
    needs = f"the training image's CUDA 13 wheels need {MIN_DRIVER} or newer"
    if old:
        return Check("GPU driver", False, f"{', '.join(old)}; {needs}")
    if unread:
        return Check(
            "GPU driver",
            True,
            f"could not read the NVIDIA driver of {', '.join(unread)} (no {DRIVER_MAJOR_LABELS[0]} "
            f"label: is GPU feature discovery running?); {needs}",
            warning=True,
        )
    return Check("GPU driver", True, f"{MIN_DRIVER} or newer on all {len(drivers)} GPU nodes")


def namespace_check(api, namespace: str, mode: str) -> Check:
    labels = api.read_namespace(namespace, _request_timeout=10).metadata.labels or {}
    level = labels.get("pod-security.kubernetes.io/enforce", "privileged")
    if level == "restricted":
        return Check(
            "namespace",
            False,
            f"{namespace} enforces Pod Security restricted: KFP 2.17 executor "
            "pods set no runAsNonRoot and are rejected (use baseline, k8s/modes/multi-user)",
        )
    if mode == "multi-user" and labels.get(PROFILE_LABEL[0]) != PROFILE_LABEL[1]:
        return Check(
            "namespace",
            False,
            f"{namespace} is not a Profile namespace "
            f"(no {PROFILE_LABEL[0]}={PROFILE_LABEL[1]}; the object store admits only those)",
        )
    return Check("namespace", True, f"{namespace} (Pod Security {level})")


def launcher_check(api, namespace: str, mode: str) -> Check:
    from kubernetes.client.exceptions import ApiException

    try:
        data = api.read_namespaced_config_map("kfp-launcher", namespace).data or {}
    except ApiException as err:
        return Check("kfp-launcher ConfigMap", False, f"{err.reason}: is KFP installed here?")
    root = data.get("defaultPipelineRoot") or "minio://mlpipeline/v2/artifacts"
    allowed = f"minio://mlpipeline/private-artifacts/{namespace}/"
    if mode == "multi-user" and root.startswith("minio://") and not root.startswith(allowed):
        return Check(
            "kfp-launcher ConfigMap",
            False,
            f"pipeline root {root} is outside {allowed} (the profile's object-store policy)",
        )
    return Check("kfp-launcher ConfigMap", True, f"pipeline root {root}")


def cluster_checks(namespace: str, mode: str, secrets: tuple[str, ...]) -> list[Check]:
    from kubernetes.client.exceptions import ApiException

    try:
        api = kubernetes_client()
        checks = [namespace_check(api, namespace, mode)]
    except ApiException as err:
        return [Check("namespace", False, f"{namespace}: {err.reason}")]
    except Exception as err:  # noqa: BLE001 - no kubeconfig, no route: one readable line
        return [Check("kubernetes API", False, f"cannot reach the cluster ({err})")]
    account = MODES[mode][1]
    try:
        api.read_namespaced_service_account(account, namespace, _request_timeout=10)
        checks.append(Check(f"service account {account}", True, "present"))
    except ApiException as err:
        checks.append(
            Check(
                f"service account {account}",
                False,
                f"{err.reason}: {mode} KFP runs pipeline pods as it",
            )
        )
    for secret in secrets:
        try:
            api.read_namespaced_secret(secret, namespace, _request_timeout=10)
            checks.append(Check(f"secret {secret}", True, "present"))
        except ApiException as err:
            checks.append(Check(f"secret {secret}", False, err.reason or "not found"))
    checks.append(launcher_check(api, namespace, mode))
    try:
        pool = api.read_namespaced_config_map("grail-gpu-pool", namespace).data
        checks += gpu_nodes(api, json.loads(pool["node_selector"]), pool["gpu_type"])
    except ApiException:
        checks += gpu_nodes(api, {}, "nvidia.com/gpu")
    return checks


def mlflow_check(uri: str) -> Check:
    """An API call, not /health: MLflow >= 3.5 refuses API calls whose Host it does not allow
    (403) while /health answers 200."""
    url = f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/search?max_results=1"
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return Check("MLflow server", True, f"{mask_secrets(uri)} answered {reply.status}")
    except urllib.error.HTTPError as err:
        hint = " (Invalid Host header: add this host to --allowed-hosts)" if err.code == 403 else ""
        return Check("MLflow server", False, f"{mask_secrets(uri)} answered {err.code}{hint}")
    except OSError as err:
        reason = getattr(err, "reason", err)
        return Check("MLflow server", False, f"{mask_secrets(uri)} did not answer ({reason})")


@dataclass(kw_only=True)
class DoctorConfig:
    """grail doctor: check a cluster has what a run needs."""

    mode: Literal["standalone", "multi-user"] = option(
        "KFP install mode (docs/cluster/kubeflow.md#which-install-mode).", "standalone"
    )
    namespace: str | None = option(
        "Where KFP runs the pipeline's pods (default: kubeflow; multi-user: the Profile's).", None
    )
    kfp_host: str | None = option("KFP API URL (default: $KFP_HOST).", None)
    mlflow_uri: str | None = option("MLflow server URL (default: $MLFLOW_TRACKING_URI).", None)


def doctor(config: DoctorConfig | None = None, secrets: tuple[str, ...] = SECRETS) -> list[Check]:
    """Every check, in order."""
    config = config or DoctorConfig()
    mode = config.mode
    checks = cluster_checks(config.namespace or MODES[mode][0], mode, secrets)
    kfp_host = config.kfp_host or os.environ.get("KFP_HOST")
    checks.append(
        _reachable("KFP API", f"{kfp_host.rstrip('/')}/apis/v2beta1/healthz")
        if kfp_host
        else Check("KFP API", False, "no --kfp-host (or KFP_HOST) given")
    )
    mlflow_uri = config.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
    checks.append(
        mlflow_check(mlflow_uri)
        if mlflow_uri and mlflow_uri.startswith("http")
        else Check("MLflow server", False, "no http MLFLOW_TRACKING_URI given")
    )
    return checks
