"""``grail submit [pipelines/grail.yaml] --host URL --experiment NAME [--param k=v ...]``: a run
of the compiled DAG through ``kfp.Client`` (token or cookie from a file or the environment)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from grail.core.config import option, parse_params
from grail.core.errors import GrailError


def parameter_types(package: str | Path) -> dict[str, str]:
    """Pipeline parameter -> its declared type (STRING, NUMBER_INTEGER, LIST, ...)."""
    import yaml

    try:
        spec = next(yaml.safe_load_all(Path(package).read_text()))
        declared = spec["root"]["inputDefinitions"]["parameters"]
    except (OSError, yaml.YAMLError, KeyError, TypeError, StopIteration) as error:
        raise GrailError(f"{package}: not a compiled pipeline ({error})") from None
    return {name: item["parameterType"] for name, item in declared.items()}


# The training pod's size per GPU when the run does not set train_cpu/train_memory: one rank per
# GPU, each holding CUDA's and vLLM's host memory, its loader and (rank 0) a gathered 16-bit
# model at saves; /dev/shm (NCCL) counts against the limit. An H100 node offers about 26 CPUs and
# 234 GB per GPU (GKE a3-highgpu-1g to -8g), so this fits every shape. The compiled defaults
# (8 CPUs, 64Gi) are one GPU's and stay the floor.
CPUS_PER_GPU, GIB_PER_GPU = 6, 24
FLOOR_CPU, FLOOR_GIB = 8, 64


def sized_for_gpus(arguments: dict) -> dict:
    """The training pod's `train_cpu`/`train_memory` for `gpu_count` GPUs (per node of a
    TrainJob), where the run leaves them unset; set ones are kept.

    >>> sized_for_gpus({"gpu_count": "8"})
    {'gpu_count': '8', 'train_cpu': '48', 'train_memory': '192Gi'}
    >>> sized_for_gpus({"gpu_count": "8", "train_memory": "1Ti"})["train_memory"]
    '1Ti'
    >>> sized_for_gpus({})
    {}
    """
    try:
        gpus = int(str(arguments.get("gpu_count", "1")))
    except ValueError:
        raise GrailError(f"--param gpu_count: {arguments['gpu_count']!r} is not a number") from None
    if gpus <= 1:
        return arguments
    sized = {
        "train_cpu": str(max(FLOOR_CPU, CPUS_PER_GPU * gpus)),
        "train_memory": f"{max(FLOOR_GIB, GIB_PER_GPU * gpus)}Gi",
    }
    return arguments | {k: v for k, v in sized.items() if k not in arguments}


def read_secret_file(path: str | None, variable: str) -> str | None:
    """A token or cookie from a file, else from an environment variable (never a flag: a flag
    shows in `ps` and shell history)."""
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as error:
            raise GrailError(f"{path}: cannot read ({error.strerror})") from None
    return os.environ.get(variable) or None


@dataclass(kw_only=True)
class SubmitConfig:
    """grail submit: create a run of the compiled pipeline on a Kubeflow Pipelines cluster."""

    package: str = option("Compiled pipeline.", "pipelines/grail.yaml")
    host: str = option("KFP API endpoint URL.")
    experiment: str = option("KFP experiment name.")
    params: list[str] = option(
        "Pipeline parameter (JSON values: numbers, lists, true/false); repeatable.",
        [],
        aliases=["--param"],
        action="extend",
        metavar="KEY=VALUE",
    )
    run_name: str | None = option("Run name (default: grail-<time>).", None)
    namespace: str | None = option(
        "Multi-user KFP: the Profile namespace the run (and its experiment) belongs to.", None
    )
    pipeline_root: str | None = option(
        "Artifact root for this run (default: the namespace's kfp-launcher ConfigMap).", None
    )
    service_account: str | None = option(
        "Service account the run's pods use (default: pipeline-runner / default-editor).", None
    )
    token_file: str | None = option(
        "File holding a bearer token (default: $KF_PIPELINES_TOKEN).", None
    )
    cookie_file: str | None = option(
        "File holding a session cookie, e.g. authservice_session=... "
        "(default: $KF_PIPELINES_COOKIE).",
        None,
    )

    POSITIONAL: ClassVar[tuple[str, ...]] = ("package",)


def submit(config: SubmitConfig) -> str:
    """Create a run of the compiled pipeline on a KFP cluster; returns the run id.

    ``namespace`` is the Profile namespace in multi-user mode (the run and its experiment live
    there); ``pipeline_root`` overrides the namespace's kfp-launcher default; the token (file or
    ``KF_PIPELINES_TOKEN``) is sent as ``Authorization: Bearer`` and the cookie as a Cookie
    header (e.g. ``authservice_session=...`` behind Kubeflow's oauth2-proxy/dex), the two ways
    ``kfp.Client`` authenticates.
    """
    import kfp

    arguments = parse_params(config.params, parameter_types(config.package))
    sized = sized_for_gpus(arguments)
    if sized != arguments:
        print(
            f"train pod for {sized['gpu_count']} GPUs: train_cpu={sized['train_cpu']} "
            f"train_memory={sized['train_memory']} (--param to change)"
        )
    arguments = sized
    token = read_secret_file(config.token_file, "KF_PIPELINES_TOKEN")
    cookie = read_secret_file(config.cookie_file, "KF_PIPELINES_COOKIE")
    try:
        client = kfp.Client(
            host=config.host,
            namespace=config.namespace or "kubeflow",
            existing_token=token,
            cookies=cookie,
        )
        result = client.create_run_from_pipeline_package(
            config.package,
            arguments=arguments,
            experiment_name=config.experiment,
            run_name=config.run_name or f"grail-{time.strftime('%Y%m%d-%H%M%S')}",
            namespace=config.namespace,
            pipeline_root=config.pipeline_root,
            service_account=config.service_account,
        )
    except Exception as error:  # kfp raises urllib3, ApiException, TimeoutError, ...
        raise GrailError(f"submit to {config.host}: {_first_line(error)}") from error
    return result.run_id


def _first_line(error: Exception) -> str:
    from grail.core.errors import mask_secrets

    text = str(error).strip().splitlines()
    return mask_secrets(f"{type(error).__name__}: {text[0] if text else ''}")
