"""The pipeline: compile drift, the training task's platform settings, a whole local run with a
real MLflow server, export idempotence on S3, submit parameters."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ports import free_port, start_server, stop_server

from grail.export import MANIFEST, export
from grail.images import IMAGE, TRAIN_IMAGE
from grail.launch import compile_pipeline, parse_params
from grail.storage import Location, list_files

ROOT = Path(__file__).resolve().parents[1]
COMPILED = ROOT / "pipelines" / "grail.yaml"


def test_committed_pipeline_matches_a_fresh_compile(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("GRAIL_KFP_LOCAL", raising=False)
    fresh = compile_pipeline(tmp_path / "grail.yaml")
    assert fresh.read_text() == COMPILED.read_text(), "run `grail compile` and commit"


def _documents():
    pipeline_spec, platform_spec = yaml.safe_load_all(COMPILED.read_text())
    return pipeline_spec, platform_spec


def test_training_task_has_gpu_pool_shm_retries_and_secrets_by_name():
    pipeline_spec, platform_spec = _documents()
    executors = pipeline_spec["deploymentSpec"]["executors"]
    train = [e for name, e in executors.items() if name.startswith("exec-train")]
    assert train
    for executor in train:
        container = executor["container"]
        assert container["image"] == "{{$.inputs.parameters['pipelinechannel--train_image']}}"
        accelerator = container["resources"]["accelerator"]
        assert "gpu_type" in accelerator["resourceType"]
        assert "gpu_count" in accelerator["resourceCount"]
    others = [e for name, e in executors.items() if not name.startswith("exec-train")]
    assert others and all(
        e["container"]["image"] == "{{$.inputs.parameters['pipelinechannel--image']}}"
        for e in others
    )
    defaults = pipeline_spec["root"]["inputDefinitions"]["parameters"]
    assert defaults["train_image"]["defaultValue"] == TRAIN_IMAGE
    assert defaults["image"]["defaultValue"] == IMAGE
    kubernetes = platform_spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name in (n for n in kubernetes if n.startswith("exec-train")):
        config = kubernetes[name]
        assert config["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"]
        assert config["tolerations"][0]["tolerationJson"]["componentInputParameter"]
        assert config["emptyDirMounts"][0] == {
            "mountPath": "/dev/shm",
            "volumeName": "dshm",
            "medium": "Memory",
        }
        secrets = {
            s["secretNameParameter"]["componentInputParameter"] for s in config["secretAsEnv"]
        }
        assert len(secrets) == 2  # object store + MLflow, names given per run
    text = COMPILED.read_text()
    assert "retryPolicy" in text and "backoffFactor" in text
    root_inputs = pipeline_spec["root"]["inputDefinitions"]["parameters"]
    for parameter in (
        "gpu_type",
        "gpu_count",
        "node_selector",
        "tolerations",
        "image",
        "train_image",
        "issues",
        "algorithm",
        "generate_data",
        "recipe_overrides",
        "reference_models",
        "export_destination",
        "mlflow_experiment",
        "raw_uri",
        "participants",
        "s3_secret",
        "openai_secret",
    ):
        assert parameter in root_inputs, parameter


def test_no_secret_value_in_the_compiled_yaml():
    text = COMPILED.read_text()
    assert not re.search(r"AKIA[0-9A-Z]{16}|sk-[A-Za-z0-9]{20,}", text)
    assert not re.search(r"(?i)(password|secret_access_key)\s*[:=]\s*['\"]?[A-Za-z0-9/+]{8,}", text)


def test_train_benchmark_export_do_not_cache():
    pipeline_spec, _ = _documents()
    tasks = {}

    def walk(dag):
        for name, task in dag.get("tasks", {}).items():
            tasks[name] = task

    for component in pipeline_spec["components"].values():
        walk(component.get("dag", {}))
    for name, task in tasks.items():
        if re.match(r"(train|benchmark|export)(-\d+)?$", name):
            assert task.get("cachingOptions", {}).get("enableCache") is not True, name


def test_submit_parameters_are_parsed_as_json_when_they_can_be():
    assert parse_params(
        ['issues=["gun_control"]', "gpu_count=8", "algorithm=grpo", "tiny_model=true"]
    ) == {"issues": ["gun_control"], "gpu_count": 8, "algorithm": "grpo", "tiny_model": True}


def _tree(folder: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def test_export_is_idempotent_and_completes_a_partial_upload(s3, tmp_path):
    import boto3

    model = _tree(
        tmp_path / "model",
        {
            "config.json": b"{}",
            "model.safetensors": b"w" * 5000,
            "checkpoint-2/model.safetensors": b"old",
        },
    )
    bench = _tree(tmp_path / "bench", {"report.md": b"# r", "accuracy_by_model.svg": b"<svg/>"})
    dest = f"s3://{s3}/exports/run1"
    first = export(model, bench, dest, run_ids={"train": "abc"})
    assert sorted(first["uploaded"]) == sorted(
        [
            "model/config.json",
            "model/model.safetensors",
            "benchmark/report.md",
            "benchmark/accuracy_by_model.svg",
            MANIFEST,
        ]
    )
    manifest = first["manifest"]
    assert manifest["files"]["model/model.safetensors"]["size"] == 5000
    assert len(manifest["files"]["benchmark/report.md"]["sha256"]) == 64
    assert manifest["source_run_ids"] == {"train": "abc"}
    second = export(model, bench, dest, run_ids={"train": "abc"})
    assert second["uploaded"] == []  # nothing unchanged is uploaded again
    client = boto3.client("s3")  # an interrupted upload: one file and the manifest missing
    client.delete_object(Bucket=s3, Key="exports/run1/model/model.safetensors")
    client.delete_object(Bucket=s3, Key=f"exports/run1/{MANIFEST}")
    third = export(model, bench, dest, run_ids={"train": "abc"})
    assert sorted(third["uploaded"]) == ["manifest.json", "model/model.safetensors"]
    (bench / "report.md").write_bytes(b"# changed")
    fourth = export(model, bench, dest, run_ids={"train": "abc"})
    assert sorted(fourth["uploaded"]) == ["benchmark/report.md", "manifest.json"]
    stored = json.loads(client.get_object(Bucket=s3, Key=f"exports/run1/{MANIFEST}")["Body"].read())
    assert stored["files"]["benchmark/report.md"]["size"] == len(b"# changed")
    assert "model/checkpoint-2/model.safetensors" not in list_files(Location.parse(dest))


def test_export_to_a_folder(tmp_path):
    model = _tree(tmp_path / "model", {"config.json": b"{}"})
    assert export(model, None, str(tmp_path / "out"))["uploaded"] == ["model/config.json", MANIFEST]
    assert export(model, None, str(tmp_path / "out"))["uploaded"] == []


def test_kfp_plugin_run_is_used_as_the_stage_run(monkeypatch, tmp_path):
    from mlflow.tracking import MlflowClient

    from grail import tracking

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("e", str(tmp_path / "a"))).info.run_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("KFP_MLFLOW_CONFIG", "{}")
    monkeypatch.setenv("MLFLOW_RUN_ID", run)
    assert tracking.start_pipeline_run("e", {}) == ""
    with tracking.stage_run("", "clean", {"seed": 3}) as stage:
        assert stage == run
    assert client.get_run(run).data.params == {"seed": "3"}


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1 with a sqlite backend."""
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(
        [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{folder / 'db.sqlite'}",
            "--artifacts-destination",
            str(folder / "artifacts"),
        ],
        f"{url}/health",
        "mlflow server",
        env=os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    yield url
    stop_server(server)


@pytest.mark.slow
def test_local_pipeline_run_builds_the_mlflow_hierarchy(mlflow_server, tmp_path):
    """`grail run --local`, what `make demo` runs, against a real MLflow server."""
    from mlflow.tracking import MlflowClient

    env = os.environ | {"MLFLOW_TRACKING_URI": mlflow_server, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(  # `make demo` runs `grail run --local`: the same, but for --outputs
        [sys.executable, "-m", "grail.cli", "run", "--local", "--outputs", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "report: " in done.stdout and "mlflow ui --backend-store-uri" in done.stdout
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("grail-local")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    for tag in ("kfp_run_id", "recipe", "git_commit", "dataset_fingerprint", "image"):
        assert parent.data.tags.get(tag), tag
    assert parent.info.status == "FINISHED"
    children = {
        r.info.run_name: r
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    expected = {"clean"} | {
        f"{stage}:{issue}"
        for stage in ("train", "benchmark", "export")
        for issue in ("gun_control", "minimum_wage")
    }
    assert expected <= set(children)
    train = children["train:gun_control"]
    assert train.data.params["learning_rate"] and train.data.params["gail_use"] == "True"
    steps = [m.step for m in client.get_metric_history(train.info.run_id, "reward")]
    assert steps == list(range(1, 11))
    assert "gail/disc_loss" in train.data.metrics
    logged = {a.path for a in client.list_artifacts(train.info.run_id, "model")}
    assert {"model/config.json", "model/model.safetensors", "model/metrics.json"} <= logged
    bench = children["benchmark:minimum_wage"]
    assert "benchmark/ranker/accuracy" in bench.data.metrics
    assert children["clean"].data.metrics["rows_kept"] > 0
    manifest = json.loads((tmp_path / "export" / "gun_control" / MANIFEST).read_text())
    assert "model/model.safetensors" in manifest["files"]
    assert "benchmark/report.md" in manifest["files"]
