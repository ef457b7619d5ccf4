"""train_backend=trainjob: the train task drives a Kubeflow Trainer TrainJob through the Kubeflow
SDK against a fake Kubernetes API on 127.0.0.1 (tests/fake_k8s.py: requests recorded, bodies
validated against Trainer v2.3.0's CRD schema, the job played Created -> Running -> Complete or
Failed, its pods running the job's real command), with S3 on moto's server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import pytest
from fake_k8s import FakeKubernetes, hang, run_command
from grail.components.train.trainjob import TrainPool, job_name, train_on_trainjob
from kubernetes.config import kube_config
from tiny_settings import tiny_args

from grail.core.errors import GrailError

SECRET = "not-in-the-spec-7f3a"  # a credential value that must never reach the TrainJob
POOL = dict(
    image="ghcr.io/example/grail-train:test",
    nodes=1,
    gpu_type="nvidia.com/gpu",
    gpus_per_node=8,
    cpu="8",
    memory="64Gi",
    node_selector={"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    secrets={"grail-s3": {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID"}},
)


@pytest.fixture
def cluster(s3, s3_server, tmp_path, monkeypatch):
    """What the job's pods see: the secret `grail-s3` (the only place the S3 key lives) and an
    environment without AWS credentials; yields a function starting the fake API."""
    moto = boto3.client("s3")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {
        "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_SECRET_ACCESS_KEY": "test",
    }
    secrets = {"grail-s3": {"AWS_ACCESS_KEY_ID": SECRET}}

    def start(workload=None):
        api = FakeKubernetes(workload or run_command(secrets, env), tmp_path)
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig))
        # The Kubernetes client reads KUBECONFIG once, at import, for the SDK's namespace
        # lookup; an earlier test may have imported it. A pod reads its service account.
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(api.kubeconfig))
        return api

    return start, moto


def _args(s3, data, model, out, *extra) -> list[str]:
    where = f"s3://{s3}/checkpoints/run-1/grpo/gun_control"
    return tiny_args(
        data, model, out, "--checkpoint_uri", where, "--resume_from_checkpoint", "latest", *extra
    )


def _train(args, out, name, tmp_path, lines) -> dict:
    return train_on_trainjob(
        args,
        str(out),
        TrainPool(**POOL),
        name,
        poll_seconds=0.2,
        say=lines.append,
        workdir=str(tmp_path / f"pod-{name}"),
    )


def test_a_trainjob_trains_hands_its_model_back_and_a_retry_resumes(
    cluster, s3, tmp_path, tiny_policy, small_clean
):
    start, moto = cluster
    args = _args(
        s3, small_clean, tiny_policy, tmp_path / "out", "--max_steps", 2, "--save_steps", 1
    )
    lines: list[str] = []
    with start() as api:
        summary = _train(args, tmp_path / "out", "grail-grpo-gun-control-a1", tmp_path, lines)
        assert summary["global_step"] == 2 and summary["world_size"] == 1
        assert (tmp_path / "out" / "model.safetensors").is_file()

        (created,) = api.calls("POST", "/trainjobs")
        assert created["path"] == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs"
        spec = created["body"]["spec"]
        assert spec["runtimeRef"] == {"name": "torch-distributed", "kind": "ClusterTrainingRuntime"}
        trainer = spec["trainer"]
        assert trainer["image"] == POOL["image"] and trainer["numNodes"] == 1
        assert trainer["command"] == ["grail", "train"]
        assert trainer["resourcesPerNode"]["limits"] == {
            "nvidia.com/gpu": "8",
            "cpu": "8",
            "memory": "64Gi",
        }
        assert trainer["args"][-2:] == ["--upload_final", "true"]
        pod = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"][
            "replicatedJobs"
        ][0]["template"]["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == POOL["node_selector"]
        assert pod["tolerations"] == POOL["tolerations"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["containers"][0]["env"] == [
            {
                "name": "AWS_ACCESS_KEY_ID",
                "valueFrom": {
                    "secretKeyRef": {
                        "name": "grail-s3",
                        "key": "AWS_ACCESS_KEY_ID",
                        "optional": True,
                    }
                },
            }
        ]
        assert SECRET not in json.dumps(created["body"])
        # the job's status changes and node 0's own log, in the task's log
        name = "grail-grpo-gun-control-a1"
        said = "\n".join(lines)
        for status in ("Created", "Running", "Complete"):
            assert f"TrainJob {name}: {status}" in said
        assert f"[{name} node-0] trained 2 steps on 1 process(es)" in said
        assert api.calls("GET", "/pods/") and not api.calls("DELETE")

        # A retried task whose job died after its checkpoints but before the final model: a
        # new TrainJob resumes from the newest checkpoint and trains no step twice.
        final = moto.list_objects_v2(Bucket=s3, Prefix="checkpoints/run-1/grpo/gun_control/final/")
        for item in final["Contents"]:
            moto.delete_object(Bucket=s3, Key=item["Key"])
        retried: list[str] = []
        summary = _train(args, tmp_path / "out2", "grail-grpo-gun-control-b2", tmp_path, retried)
        assert summary["global_step"] == 2 and summary["steps_trained"] == 0
        assert "checkpoint-2 already reached step 2: training 0 steps" in "\n".join(retried)

        # ... and one whose job had finished collects the model without a new job.
        again: list[str] = []
        _train(args, tmp_path / "out3", "grail-grpo-gun-control-c3", tmp_path, again)
        assert len(api.calls("POST", "/trainjobs")) == 2
        assert "no new TrainJob" in again[0]
        assert (tmp_path / "out3" / "model.safetensors").is_file()


def test_a_failed_trainjob_fails_the_task_with_its_reason(
    cluster, s3, tmp_path, tiny_policy, small_clean
):
    start, _ = cluster
    args = _args(s3, small_clean, tiny_policy, tmp_path / "out", "--max_steps", "many")
    lines: list[str] = []
    with start() as api, pytest.raises(GrailError) as failed:
        _train(args, tmp_path / "out", "grail-grpo-gun-control-f1", tmp_path, lines)
    assert str(failed.value) == (
        "TrainJob grail-grpo-gun-control-f1 failed: FailedJobs: jobset failed due to one or "
        "more job failures; node-0: Error (exit 2)"  # the node's grail train: bad input
    )
    assert "expected int, got 'many'" in "\n".join(lines)  # the node's own line, in the task log
    assert not api.calls("DELETE")  # kept, with its pods' logs, for whoever looks into it


def test_a_stopped_task_deletes_its_trainjob(cluster, s3, s3_server, tmp_path, small_clean):
    """A cancelled KFP run stops the task's pod with SIGTERM: the TrainJob goes too."""
    start, _ = cluster
    args = _args(s3, small_clean, "Qwen/Qwen2.5-1.5B-Instruct", tmp_path / "out")
    script = (
        "import json, sys\n"
        "from grail.components.train.trainjob import TrainPool, train_on_trainjob\n"
        "pool = TrainPool(**json.loads(sys.argv[1]))\n"
        "train_on_trainjob(json.loads(sys.argv[2]), sys.argv[3], pool, 'grail-stop-me',"
        " poll_seconds=0.2, say=lambda line: print(line, flush=True))\n"
    )
    with start(hang) as api:
        task = subprocess.Popen(
            [sys.executable, "-c", script, json.dumps(POOL), json.dumps(args), str(tmp_path / "m")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(task.stdout), daemon=True)
        reader.start()
        followed = "[grail-stop-me node-0] training (until deleted)\n"
        deadline = time.monotonic() + 120
        while followed not in lines and task.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert followed in lines, "the task never showed node 0's log:\n" + "".join(lines)
        task.send_signal(signal.SIGTERM)
        task.wait(timeout=60)
        reader.join(timeout=10)
    assert task.returncode != 0
    assert [c["path"].rsplit("/", 1)[1] for c in api.calls("DELETE")] == ["grail-stop-me"]
    assert "deleted TrainJob grail-stop-me\n" in lines


def test_job_names_are_dns_labels_unique_per_attempt():
    first = job_name("run-" + "x" * 80, "grail", "minimum_wage", "pod-1")
    assert len(first) <= 63 and first.startswith("grail-grail-minimum-wage-")
    assert first != job_name("run-" + "x" * 80, "grail", "minimum_wage", "pod-2")
