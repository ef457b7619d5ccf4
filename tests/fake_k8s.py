"""A fake Kubernetes API server on 127.0.0.1 for the TrainJob launcher: just the calls the
Kubeflow SDK's TrainerClient (0.5.0, Kubernetes backend) makes, answered the way the API server,
Kubeflow Trainer v2.3.0's controller and JobSet answer them.

- Every request is recorded (method, path, query, JSON body).
- ``POST .../trainjobs`` validates the body against Trainer v2.3.0's own CRD schema
  (tests/trainer_schemas.py; 422 Invalid like the API server otherwise), 409 when the name is
  taken; the job then plays Created (pods Pending) -> Running (pods Running) -> Complete or
  Failed, with the conditions Trainer copies from the JobSet (reasons AllJobsCompleted /
  FailedJobs, pkg/runtime/framework/plugins/jobset/jobset.go Status).
- What the pods do is the `workload`: :func:`run_command` runs the job's command as a kubelet
  would (the trainer's env, secret references resolved, the PET_* variables Trainer's torch
  plugin sets), node 0's output being the pod log; :func:`hang` runs until the job is deleted.
- Pods carry JobSet's labels (jobset-name, replicatedjob-name, job-completion-index); the log
  endpoint follows node 0's output until its pod ends, chunked as the API server sends it.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import yaml
from ports import answer_json, free_port
from trainer_schemas import validate

TRAINER = Path(__file__).parent / "kubeflow_trainer" / "v2.3.0"
GROUP = "/apis/trainer.kubeflow.org/v1alpha1"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class Job:
    """One TrainJob as the cluster sees it: the object, its pods, node 0's log."""

    def __init__(self, body: dict, namespace: str):
        self.body = body
        meta = body["metadata"]
        meta |= {"namespace": namespace, "uid": os.urandom(8).hex(), "creationTimestamp": now()}
        body["status"] = {}
        self.nodes = body["spec"]["trainer"].get("numNodes", 1)
        self.phase = "Pending"
        self.lines: list[str] = []
        self.exit_code: int | None = None
        self.deleted = threading.Event()
        self.lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    def pods(self) -> list[dict]:
        trainer = self.body["spec"]["trainer"]
        pods = []
        for index in range(self.nodes):
            state = {}
            if self.exit_code is not None:
                code = self.exit_code if index == 0 else 0
                reason = "Completed" if code == 0 else "Error"
                state = {"terminated": {"exitCode": code, "reason": reason}}
            pods.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{self.name}-node-0-{index}-x{index}z",
                        "namespace": self.body["metadata"]["namespace"],
                        "creationTimestamp": self.body["metadata"]["creationTimestamp"],
                        "labels": {
                            "jobset.sigs.k8s.io/jobset-name": self.name,
                            "jobset.sigs.k8s.io/replicatedjob-name": "node",
                            "batch.kubernetes.io/job-completion-index": str(index),
                        },
                    },
                    "spec": {
                        "containers": [
                            {
                                "name": "node",
                                "image": trainer["image"],
                                "resources": trainer.get("resourcesPerNode", {}),
                            }
                        ]
                    },
                    "status": {
                        "phase": self.phase,
                        "containerStatuses": [
                            {  # the fields a V1ContainerStatus requires
                                "name": "node",
                                "image": trainer["image"],
                                "imageID": "",
                                "ready": self.phase == "Running",
                                "restartCount": 0,
                                "state": state or {"running": {}},
                            }
                        ],
                    },
                }
            )
        return pods

    def finish(self, code: int) -> None:
        with self.lock:
            self.exit_code = code
            self.phase = "Succeeded" if code == 0 else "Failed"
            if code == 0:
                condition = {
                    "type": "Complete",
                    "reason": "AllJobsCompleted",
                    "message": "jobset completed successfully",
                }
            else:
                condition = {
                    "type": "Failed",
                    "reason": "FailedJobs",
                    "message": "jobset failed due to one or more job failures",
                }
            condition |= {"status": "True", "lastTransitionTime": now()}
            self.body["status"] = {"conditions": [condition]}


def secret_env(job: dict, secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The env a kubelet gives the node container: the trainer's values, then the runtime
    patch's secret references resolved (an optional one that is missing is left out)."""
    env = {e["name"]: e["value"] for e in job["spec"]["trainer"].get("env", []) if "value" in e}
    for patch in job["spec"].get("runtimePatches", []):
        template = patch["trainingRuntimeSpec"]["template"]["spec"]
        for replicated in template["replicatedJobs"]:
            pod = replicated["template"]["spec"]["template"]["spec"]
            for container in pod.get("containers", []):
                for item in container.get("env", []):
                    ref = item.get("valueFrom", {}).get("secretKeyRef")
                    if ref and ref["key"] in secrets.get(ref["name"], {}):
                        env[item["name"]] = secrets[ref["name"]][ref["key"]]
                    elif "value" in item:
                        env[item["name"]] = item["value"]
    return env


def run_command(secrets: dict[str, dict[str, str]], base_env: dict[str, str] | None = None):
    """A workload that runs the trainer's command on every node as the torch runtime would:
    PET_NNODES, PET_NPROC_PER_NODE (1: CPU), PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT."""

    def run(job: Job) -> int:
        trainer = job.body["spec"]["trainer"]
        command = [*trainer["command"], *trainer.get("args", [])]
        port = free_port()
        env = (base_env or dict(os.environ)) | secret_env(job.body, secrets)
        procs = []
        for rank in range(job.nodes):
            node_env = env | {
                "PET_NNODES": str(job.nodes),
                "PET_NPROC_PER_NODE": "1",
                "PET_NODE_RANK": str(rank),
                "PET_MASTER_ADDR": "127.0.0.1",
                "PET_MASTER_PORT": str(port),
            }
            procs.append(
                subprocess.Popen(
                    command,
                    env=node_env,
                    stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        for line in procs[0].stdout:
            job.lines.append(line.rstrip("\n"))
            if job.deleted.is_set():
                break
        if job.deleted.is_set():
            for proc in procs:
                proc.kill()
        codes = [proc.wait() for proc in procs]
        return next((c for c in codes if c), 0)

    return run


def hang(job: Job) -> int:
    """A workload that trains until its job is deleted."""
    job.lines.append("training (until deleted)")
    job.deleted.wait(timeout=600)
    return 137


class FakeKubernetes:
    """The server; ``with FakeKubernetes(workload) as api:`` then ``api.kubeconfig``."""

    def __init__(self, workload, tmp: Path, namespace: str = "team-a", start_delay: float = 0.5):
        self.workload, self.namespace, self.start_delay = workload, namespace, start_delay
        self.jobs: dict[str, Job] = {}
        self.requests: list[dict] = []
        self.runtime = yaml.safe_load((TRAINER / "torch_distributed.yaml").read_text())
        validate(self.runtime)
        self.runtime["metadata"] |= {"uid": "r1", "creationTimestamp": now()}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self.kubeconfig = tmp / "kubeconfig"
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "runner", "user": {"token": "not-a-secret"}}],
                    "contexts": [
                        {
                            "name": "fake",
                            "context": {
                                "cluster": "fake",
                                "user": "runner",
                                "namespace": namespace,
                            },
                        }
                    ],
                    "current-context": "fake",
                }
            )
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        for job in self.jobs.values():
            job.deleted.set()
        self.server.shutdown()
        self.server.server_close()

    def calls(self, method: str, fragment: str = "") -> list[dict]:
        return [r for r in self.requests if r["method"] == method and fragment in r["path"]]

    def play(self, job: Job) -> None:
        time.sleep(self.start_delay)
        with job.lock:
            job.phase = "Running"
        try:
            code = self.workload(job)
        except Exception as error:  # a broken workload fails the job, visibly
            job.lines.append(f"fake kubelet: {error!r}")
            code = 1
        job.finish(code)

    def create(self, namespace: str, body: dict) -> tuple[int, dict]:
        try:
            validate(body)
        except (AssertionError, ValueError) as error:
            return 422, status(422, "Invalid", f"TrainJob is invalid: {error}")
        if namespace != self.namespace:
            return 403, status(403, "Forbidden", f"namespace {namespace} is not the runner's")
        name = body["metadata"]["name"]
        if name in self.jobs:
            return 409, status(409, "AlreadyExists", f'trainjobs "{name}" already exists')
        job = self.jobs[name] = Job(body, namespace)
        threading.Thread(target=self.play, args=(job,), daemon=True).start()
        return 201, job.body

    def handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the API server's: keep-alive, chunked log streams

            def log_message(self, *args):
                pass

            def reply(self, code: int, body: dict) -> None:
                answer_json(self, body, code)

            def record(self, body=None) -> tuple[list[str], dict]:
                url = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                api.requests.append(
                    {"method": self.command, "path": url.path, "query": query, "body": body}
                )
                return url.path.strip("/").split("/"), query

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                parts, _ = self.record(body)
                if (
                    parts[:3] == ["apis", "trainer.kubeflow.org", "v1alpha1"]
                    and parts[-1] == "trainjobs"
                ):
                    self.reply(*api.create(parts[4], body))
                else:
                    self.reply(404, status(404, "NotFound", self.path))

            def do_DELETE(self):
                parts, _ = self.record()
                job = api.jobs.pop(parts[-1], None) if "trainjobs" in parts else None
                if job is None:
                    self.reply(404, status(404, "NotFound", f"{parts[-1]} not found"))
                    return
                job.deleted.set()
                self.reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

            def do_GET(self):
                parts, query = self.record()
                path = "/".join(parts)
                if path == "api/v1/namespaces/kubeflow-system/configmaps/kubeflow-trainer-public":
                    self.reply(
                        200,
                        {
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "metadata": {"name": parts[-1], "namespace": "kubeflow-system"},
                            "data": {"kubeflow_trainer_version": "v2.3.0"},
                        },
                    )
                elif path == f"{GROUP[1:]}/clustertrainingruntimes/torch-distributed":
                    self.reply(200, api.runtime)
                elif "trainjobs" in parts and parts[-1] != "trainjobs":
                    job = api.jobs.get(parts[-1])
                    if job is None:
                        self.reply(404, status(404, "NotFound", f"{parts[-1]} not found"))
                    else:
                        with job.lock:
                            self.reply(200, job.body)
                elif parts[-1] == "pods":
                    selector = dict(
                        p.split("=", 1)
                        for p in query.get("labelSelector", "").split(",")
                        if "=" in p
                    )
                    job = api.jobs.get(selector.get("jobset.sigs.k8s.io/jobset-name", ""))
                    with job.lock if job else threading.Lock():
                        items = job.pods() if job else []
                    self.reply(
                        200,
                        {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items},
                    )
                elif parts[-1] == "log":
                    # the Python client sends follow=True: Go's strconv.ParseBool takes it
                    follow = query.get("follow", "") in ("1", "t", "T", "true", "TRUE", "True")
                    self.follow(parts[-2], follow)
                else:
                    self.reply(404, status(404, "NotFound", self.path))

            def follow(self, pod: str, follow: bool) -> None:
                job = next((j for j in api.jobs.values() if pod.startswith(j.name)), None)
                if job is None:
                    self.reply(404, status(404, "NotFound", f"pod {pod} not found"))
                    return
                # chunked, one chunk per line, as the API server streams a followed log: the
                # Python client's line reader yields a line when its chunk arrives
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                sent = 0
                while True:
                    lines = job.lines[sent:]
                    for line in lines:
                        data = f"{line}\n".encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                    sent += len(lines)
                    if not follow or (job.exit_code is not None and sent == len(job.lines)):
                        break
                    if job.deleted.is_set():
                        break
                    time.sleep(0.1)
                self.wfile.write(b"0\r\n\r\n")

        return Handler
