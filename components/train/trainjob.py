"""Training as a Kubeflow Trainer TrainJob, for the train task with ``train_backend=trainjob``.

The task runs on a small CPU pod and drives a TrainJob (``trainer.kubeflow.org/v1alpha1``, the
``torch-distributed`` ClusterTrainingRuntime of Trainer v2.3) through the Kubeflow SDK's
``TrainerClient`` (Kubernetes backend: in-cluster credentials, or ``KUBECONFIG`` elsewhere):

1. stage the dataset in object storage beside the checkpoints (the job's pods cannot read the
   task's KFP artifacts);
2. create the job: ``nodes`` x ``gpus`` of the training pool, the training image, the task's
   secrets as environment references (never values), ``grail train`` with the task's own
   arguments, and ``--upload_final`` so rank 0 leaves the model in ``checkpoint_uri/final``.
   Each node's ``grail train`` reads the ``PET_*`` variables Trainer's torch plugin sets and
   starts the same accelerate + DeepSpeed ZeRO-3 plan as a pod, spanning the nodes
   (:class:`grail.train.multigpu.Nodes`); ``vllm_mode: server`` is refused before any job;
3. print each status change and node 0's log in the task's log; fail with the job's reason;
   delete the job when the task is stopped (a cancelled KFP run sends SIGTERM);
4. download the final model into the task's output.

A retried task creates a new job that resumes from the newest checkpoint (same checkpoint
location: the key is the KFP run id); one that finds the final model already there skips the
job. Tested against a fake Kubernetes API (tests/fake_k8s.py) and Trainer v2.3.0's CRD schemas.
"""

from __future__ import annotations

import functools
import hashlib
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from grail.core.errors import GrailError

RUNTIME = "torch-distributed"  # the ClusterTrainingRuntime Trainer v2.3 installs
# The node command: grail's own launcher (not torchrun), so that a node trains under the same
# ZeRO-3 plan as a pod; Trainer's torch plugin sets PET_* for any command but torchtune's.
NODE_COMMAND = ["grail", "train"]
NODE = "node"  # that runtime's replicated job and container
WORKDIR = "/tmp/grail-train"  # the model's folder inside a job pod
IMAGE_USER = 10001  # the uid of our images' user


@dataclass(frozen=True)
class TrainPool:
    """Where and how big: the training pool's settings of the pipeline run."""

    image: str
    nodes: int
    gpu_type: str
    gpus_per_node: int
    cpu: str
    memory: str
    node_selector: dict = field(default_factory=dict)
    tolerations: list = field(default_factory=list)
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)  # secret -> {env: key}


def job_name(kfp_run_id: str, algorithm: str, issue: str, attempt: str) -> str:
    """A TrainJob name (a DNS label, at most 63 characters) unique per task attempt.

    >>> job_name("8e1c-44", "grail", "gun_control", "pod-abc")
    'grail-grail-gun-control-400ce77245'
    """
    digest = hashlib.sha256(f"{kfp_run_id}/{attempt}".encode()).hexdigest()[:10]
    return f"grail-{algorithm}-{issue.replace('_', '-')}-{digest}"[:63]


def option_value(args: list[str], flag: str) -> str | None:
    """The value after `flag` in a ``grail train`` argument list (the last one wins, as in
    argparse).

    >>> option_value(["--dataset", "a", "--dataset", "b"], "--dataset")
    'b'
    """
    values = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == flag]
    return values[-1] if values else None


def job_arguments(args: list[str], dataset: str, workdir: str = WORKDIR) -> list[str]:
    """The task's ``grail train`` arguments as the job's pods run them: the staged dataset, a
    folder of the pod's own, and the final model uploaded for the task to collect."""
    return [*args, "--dataset", dataset, "--output_dir", workdir, "--upload_final", "true"]


def secret_env(pool: TrainPool) -> list[dict]:
    """Each secret key as an environment reference (optional, as on the task's own pod)."""
    return [
        {"name": env, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
        for secret, keys in pool.secrets.items()
        for env, key in keys.items()
    ]


def runtime_patch(pool: TrainPool):
    """The node pool, security context, shared memory and secret references of the job's
    ``node`` pods, as the runtime patch Trainer v2.3 accepts."""
    from kubeflow.trainer.options.kubernetes import (
        ContainerPatch,
        JobSetSpecPatch,
        JobSetTemplatePatch,
        JobSpecPatch,
        JobTemplatePatch,
        PodSpecPatch,
        PodTemplatePatch,
        ReplicatedJobPatch,
        RuntimePatch,
        TrainingRuntimeSpecPatch,
    )

    container = ContainerPatch(
        name=NODE,
        env=secret_env(pool),
        volume_mounts=[{"name": "dshm", "mountPath": "/dev/shm"}],
        security_context={
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    )
    pod = PodSpecPatch(
        node_selector=pool.node_selector or None,
        tolerations=pool.tolerations or None,
        volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        security_context={
            "runAsUser": IMAGE_USER,
            "runAsGroup": IMAGE_USER,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        containers=[container],
    )
    job = ReplicatedJobPatch(
        name=NODE,
        template=JobTemplatePatch(
            spec=JobSpecPatch(template=PodTemplatePatch(spec=pod)),
        ),
    )
    return RuntimePatch(  # the SDK names itself its manager
        training_runtime_spec=TrainingRuntimeSpecPatch(
            template=JobSetTemplatePatch(spec=JobSetSpecPatch(replicated_jobs=[job]))
        ),
    )


def create(client, name: str, pool: TrainPool, arguments: list[str], env: dict[str, str]):
    """Create the TrainJob through the SDK; returns its name."""
    from kubeflow.trainer import CustomTrainerContainer
    from kubeflow.trainer.options import Labels, Name, TrainerArgs, TrainerCommand

    trainer = CustomTrainerContainer(
        image=pool.image,
        num_nodes=pool.nodes,
        resources_per_node={
            pool.gpu_type: str(pool.gpus_per_node),  # a quantity: "8" (the SDK sends 8 as 8.0)
            "cpu": pool.cpu,
            "memory": pool.memory,
        },
        env=env,
    )
    return client.train(
        runtime=RUNTIME,
        trainer=trainer,
        options=[
            Name(name=name),
            Labels(labels={"app.kubernetes.io/part-of": "grail"}),
            TrainerCommand(command=NODE_COMMAND),
            TrainerArgs(args=arguments),
            runtime_patch(pool),
        ],
    )


def failure_reason(client, name: str) -> str:
    """The reason and message of the job's Failed condition (what Trainer copies from its
    JobSet), and each node whose container ended badly, e.g. ``node-1: OOMKilled (exit 137)``."""
    from kubeflow.trainer.constants import constants

    backend = client.backend
    job = backend.custom_api.get_namespaced_custom_object(
        constants.GROUP, constants.VERSION, backend.namespace, constants.TRAINJOB_PLURAL, name
    )
    conditions = (job.get("status") or {}).get("conditions") or []
    failed = [c for c in conditions if c.get("type") == constants.TRAINJOB_FAILED]
    reason = f"{failed[0].get('reason')}: {failed[0].get('message')}" if failed else "Failed"
    pods = backend.core_api.list_namespaced_pod(
        backend.namespace, label_selector=f"{constants.JOBSET_NAME_LABEL}={name}"
    )
    for pod in pods.items:
        index = pod.metadata.labels.get(constants.JOB_INDEX_LABEL, "?")
        for container in (pod.status and pod.status.container_statuses) or []:
            ended = container.state and container.state.terminated
            if ended and ended.exit_code:
                reason += f"; {NODE}-{index}: {ended.reason} (exit {ended.exit_code})"
    return reason


class Stopped(Exception):
    """The task was told to stop (SIGTERM: the KFP run was cancelled)."""


def on_sigterm(signum, frame):
    raise Stopped("the task was stopped (SIGTERM)")


def follow_logs(client, name: str, say: Callable[[str], None]) -> threading.Thread:
    """Node 0's log, line by line into the task's log, from a background thread."""

    def read():
        try:
            for line in client.get_job_logs(name, follow=True):
                say(f"[{name} {NODE}-0] {line.rstrip()}")
        except Exception as error:  # the job's log is a courtesy: its status decides
            say(f"[{name}] log stream ended: {error}")

    thread = threading.Thread(target=read, name="trainjob-logs", daemon=True)
    thread.start()
    return thread


def wait(client, name: str, say: Callable[[str], None], poll_seconds: float) -> None:
    """Poll the job until it completes (return) or fails (GrailError with Trainer's reason);
    status changes and node 0's log go to `say`."""
    from kubeflow.trainer.constants import constants

    status, logs = None, None
    while True:
        job = client.get_job(name)
        if job.status != status:
            status = job.status
            say(f"TrainJob {name}: {status}")
        started = any(s.name == f"{NODE}-0" and s.status != "Pending" for s in job.steps)
        if logs is None and started:
            logs = follow_logs(client, name, say)
        if status == constants.TRAINJOB_COMPLETE:
            break
        if status == constants.TRAINJOB_FAILED:
            raise GrailError(f"TrainJob {name} failed: {failure_reason(client, name)}")
        time.sleep(poll_seconds)
    if logs is not None:
        logs.join(timeout=30)


def trainer_client(namespace: str | None = None):
    """The SDK's client: in a pod, the service account's namespace and token; elsewhere the
    current ``KUBECONFIG`` context."""
    from kubeflow.trainer import KubernetesBackendConfig, TrainerClient

    # KUBECONFIG read now: the Kubernetes client reads it once, when first imported
    config = KubernetesBackendConfig(namespace=namespace, config_file=os.environ.get("KUBECONFIG"))
    return TrainerClient(backend_config=config)


def refuse_server_mode(args: list[str], nodes: int) -> None:
    """``vllm_mode: server`` across nodes, refused before a job takes GPUs (the nodes' own
    launcher would refuse it: :func:`grail.train.multigpu.launch_plan`)."""
    from grail.train.config import parse_train_args
    from grail.train.multigpu import check_server_mode

    if nodes > 1:
        config, _ = parse_train_args(args)
        check_server_mode(config.use_vllm, config.vllm_mode, nodes)


def train_on_trainjob(
    args: list[str],
    out: str,
    pool: TrainPool,
    name: str,
    client=None,
    poll_seconds: float = 10.0,
    say: Callable[[str], None] = print,
    workdir: str = WORKDIR,
) -> dict:
    """Run ``grail train ARGS`` as a TrainJob and put its final model in `out` (the train
    task's runner with ``train_backend=trainjob``); returns the run summary."""
    import json

    from grail.core.checkpoints import download_final
    from grail.core.storage import Location, upload_folder

    location = option_value(args, "--checkpoint_uri")
    if not location or not location.startswith("s3://"):
        raise GrailError(
            "train_backend trainjob: checkpoint_uri must be s3://... (the job's pods hand the "
            "dataset and the final model over through it)"
        )
    refuse_server_mode(args, pool.nodes)
    if download_final(location, out):  # a retried task whose job had finished
        say(f"the final model is already in {location}/final: no new TrainJob")
        return json.loads((Path(out) / "summary.json").read_text())
    staged = Location.parse(location).child("inputs").child("dataset")
    upload_folder(Path(option_value(args, "--dataset")), staged)
    client = client or trainer_client()
    env = {k: os.environ[k] for k in ("MLFLOW_RUN_ID", "MLFLOW_MAX_LOG_PARAMS") if k in os.environ}
    created = False
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        create(client, name, pool, job_arguments(args, str(staged), workdir), env)
        created = True
        say(f"created TrainJob {name}: {pool.nodes} node(s) x {pool.gpus_per_node} {pool.gpu_type}")
        wait(client, name, say, poll_seconds)
    except GrailError:
        raise  # the job failed: it stays, with its pods' logs, for whoever looks into it
    except BaseException:
        if created:  # stopped (or this task broke): the job's GPUs go back
            client.delete_job(name)
            say(f"deleted TrainJob {name}")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not download_final(location, out):
        raise GrailError(f"TrainJob {name} completed but {location}/final holds no complete model")
    return json.loads((Path(out) / "summary.json").read_text())


def runner_for(
    backend: str,
    pool: TrainPool,
    out: str,
    branch: tuple[str, str, str],
    local_models: bool,
    secrets: dict[str, str],
):
    """The train task's runner for `backend` "trainjob": ``grail train ARGS`` as a TrainJob
    named for this attempt at `branch` (KFP run id, issue, algorithm), its model into `out`;
    `secrets` names the S3 and MLflow secrets its pods read."""
    from grail.components.secrets import MLFLOW_KEYS, S3_KEYS

    if backend != "trainjob":
        raise GrailError(f"train_backend: expected pod or trainjob, got {backend!r}")
    if local_models:
        raise GrailError(
            "train_backend trainjob trains the recipe's own model: tiny_model and "
            "generate_data run with train_backend pod"
        )
    pool = replace(pool, secrets={secrets["s3"]: S3_KEYS, secrets["mlflow"]: MLFLOW_KEYS})
    kfp_run_id, issue, algorithm = branch
    name = job_name(kfp_run_id, algorithm, issue, os.environ.get("HOSTNAME", ""))
    return functools.partial(train_on_trainjob, out=out, pool=pool, name=name)
