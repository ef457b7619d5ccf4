"""The pipeline: compile drift, the training task's platform settings, a whole local run with a
real MLflow server, export idempotence on S3, submit parameters."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import browser
import pytest
import yaml
from kfp_driver import problems
from ports import free_port

from grail.core.config import parse_params
from grail.core.images import IMAGE, TRAIN_IMAGE
from grail.core.storage import Location, list_files
from grail.export.stage import MANIFEST, export
from grail.launch.compile import compile_pipeline
from grail.launch.local import RunConfig, task_defaults

DEMO_STEPS = task_defaults(RunConfig()).max_steps  # what `make demo` trains per branch

ROOT = Path(__file__).resolve().parents[1]
COMPILED = ROOT / "pipelines" / "grail.yaml"
SUMMARIZE = ROOT / "pipelines" / "summarize.yaml"  # the summarize task's DAG
BOTH = pytest.mark.parametrize("compiled", [COMPILED, SUMMARIZE], ids=["slate", "summarize"])


@pytest.mark.parametrize(("task", "committed"), [("slate", COMPILED), ("summarize", SUMMARIZE)])
def test_committed_pipeline_matches_a_fresh_compile(tmp_path, monkeypatch, task, committed):
    monkeypatch.chdir(ROOT)
    fresh = compile_pipeline(tmp_path / committed.name, task)
    assert fresh.read_text() == committed.read_text(), "run `grail compile` and commit"


def _documents(compiled: Path = COMPILED):
    pipeline_spec, platform_spec = yaml.safe_load_all(compiled.read_text())
    return pipeline_spec, platform_spec


def _launchers(pipeline_spec) -> set[str]:
    """The executors of the train tasks that launch a TrainJob (train_backend=trainjob)."""
    components = pipeline_spec["components"]
    return {
        components[task["componentRef"]["name"]]["executorLabel"]
        for component in components.values()
        for task in component.get("dag", {}).get("tasks", {}).values()
        if task["taskInfo"]["name"] == "train (TrainJob)"
    }


def test_training_task_has_gpu_pool_shm_retries_and_secrets_by_name():
    pipeline_spec, platform_spec = _documents()
    executors = pipeline_spec["deploymentSpec"]["executors"]
    launchers = _launchers(pipeline_spec)
    # Training, the benchmark of its checkpoints (vLLM) and the counterfactual sessions (asked
    # as the benchmark asks) run in the training image on a GPU pool.
    on_gpu = ("exec-train", "exec-bench", "exec-counterfactual")
    train = [
        e for name, e in executors.items() if name.startswith(on_gpu) and name not in launchers
    ]
    assert train
    for executor in train:
        container = executor["container"]
        assert container["image"] == "{{$.inputs.parameters['pipelinechannel--train_image']}}"
        accelerator = container["resources"]["accelerator"]
        assert "gpu_type" in accelerator["resourceType"]
        assert "gpu_count" in accelerator["resourceCount"]
    others = [
        e for name, e in executors.items() if not name.startswith(on_gpu) or name in launchers
    ]
    assert others and all(
        e["container"]["image"] == "{{$.inputs.parameters['pipelinechannel--image']}}"
        for e in others
    )
    defaults = pipeline_spec["root"]["inputDefinitions"]["parameters"]
    assert defaults["train_image"]["defaultValue"] == TRAIN_IMAGE
    assert defaults["image"]["defaultValue"] == IMAGE
    kubernetes = platform_spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    gpu_tasks = [n for n in kubernetes if n.startswith(on_gpu)]
    for name in (n for n in gpu_tasks if n not in launchers):
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
        # object store + MLflow (+ the OpenAI key for API reference models), names given per run
        assert len(secrets) == (3 if "bench" in name else 2)
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
        "algorithms",
        "run_name",
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


@BOTH
def test_compiled_dag_resolves_like_the_kfp_2_17_driver(compiled):
    """Every task input, artifact, loop item, pod-spec placeholder and platform setting of the
    committed YAML resolves under the 2.17 backend's rules (tests/kfp_driver.py cites them)."""
    assert problems(*_documents(compiled)) == []


def test_the_driver_check_catches_a_loop_accelerator_the_sdk_does_not_register(tmp_path):
    """The first cluster run failed this way: accelerator settings inside a ParallelFor whose
    channels the loop DAG never receives, and an integer count the driver reads as ''."""
    from kfp import compiler, dsl

    def echo(item):
        print(item)

    echo.__annotations__ = {"item": str}  # this module's annotations are strings (__future__)
    step = dsl.component(base_image="python:3.11")(echo)

    def build(register: bool):
        def loop_gpu(items=["a"], count=1, kind="nvidia.com/gpu"):  # noqa: B006
            with dsl.ParallelFor(items) as item:
                task = step(item=item).set_accelerator_type(kind).set_accelerator_limit(count)
                if register:
                    task.register_pipeline_channels([kind, count])

        loop_gpu.__annotations__ = {"items": list, "count": int, "kind": str}
        out = tmp_path / f"loop-{register}.yaml"
        compiler.Compiler().compile(dsl.pipeline(name="loop-gpu")(loop_gpu), str(out))
        return list(yaml.safe_load_all(out.read_text()))

    unregistered = problems(*build(register=False))
    assert any("does not have input parameter pipelinechannel--count" in p for p in unregistered)
    registered = problems(*build(register=True))
    assert not any("parent DAG does not have" in p for p in registered)
    assert any(
        "acceleratorCount reads pipelinechannel--count of type NUMBER_INTEGER" in p
        for p in registered
    )


@BOTH
def test_every_task_has_resource_requests_overridable_per_run(compiled):
    pipeline_spec, _ = _documents(compiled)
    root = pipeline_spec["root"]["inputDefinitions"]["parameters"]
    for name, executor in pipeline_spec["deploymentSpec"]["executors"].items():
        resources = executor["container"].get("resources", {})
        for field in ("resourceCpuRequest", "resourceMemoryRequest", "resourceMemoryLimit"):
            value = resources.get(field, "")
            parameter = re.fullmatch(
                r"\{\{\$\.inputs\.parameters\['pipelinechannel--(\w+)'\]\}\}", value
            )
            assert parameter, f"{name}: {field} is not a pipeline parameter ({value!r})"
            assert root[parameter.group(1)]["parameterType"] == "STRING"
    assert root["train_memory"]["defaultValue"] == "64Gi"
    assert root["gpu_count"]["parameterType"] == "STRING"


@BOTH
def test_every_pipeline_parameter_is_described_for_the_kubeflow_ui(compiled):
    """The pipeline's docstring is in Args: form, so the UI shows a description per parameter."""
    pipeline_spec, _ = _documents(compiled)
    parameters = pipeline_spec["root"]["inputDefinitions"]["parameters"]
    undescribed = [name for name, p in parameters.items() if not p.get("description")]
    assert undescribed == []


@BOTH
def test_no_secret_value_in_the_compiled_yaml(compiled):
    text = compiled.read_text()
    assert not re.search(r"AKIA[0-9A-Z]{16}|sk-[A-Za-z0-9]{20,}", text)
    assert not re.search(r"(?i)(password|secret_access_key)\s*[:=]\s*['\"]?[A-Za-z0-9/+]{8,}", text)


@BOTH
def test_train_benchmark_export_do_not_cache(compiled):
    pipeline_spec, _ = _documents(compiled)
    tasks = {}

    def walk(dag):
        for name, task in dag.get("tasks", {}).items():
            tasks[name] = task

    for component in pipeline_spec["components"].values():
        walk(component.get("dag", {}))
    for name, task in tasks.items():
        if re.match(r"(train|benchmark|export)(-\d+)?$", name):
            assert task.get("cachingOptions", {}).get("enableCache") is not True, name


def test_submit_parameters_follow_the_compiled_types():
    from grail.launch.submit import parameter_types

    types = parameter_types(COMPILED)
    assert parse_params(
        [
            'issues=["gun_control"]',
            "gpu_count=8",
            'algorithms=["grpo"]',
            "tiny_model=true",
            "seed=7",
        ],
        types,
    ) == {
        "issues": ["gun_control"],
        "gpu_count": "8",
        "algorithms": ["grpo"],
        "tiny_model": True,
        "seed": 7,
    }
    assert parse_params(["x=1", "y=a"]) == {"x": 1, "y": "a"}  # untyped: JSON when it is


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


def test_export_judges_objects_by_their_bytes_and_removes_only_what_it_wrote(s3, tmp_path):
    """Same-size tampering with copied metadata is repaired and a file the export no longer has
    (the previous manifest listed it) is deleted; a file put there by hand is refused and kept,
    with every object byte for byte as it was, even with --keep-stale."""
    import boto3

    from grail.core.errors import GrailError

    client = boto3.client("s3")
    prefix = "exports/run2/"

    def objects() -> dict[str, bytes]:
        listed = client.list_objects_v2(Bucket=s3, Prefix=prefix).get("Contents", [])
        return {
            o["Key"][len(prefix) :]: client.get_object(Bucket=s3, Key=o["Key"])["Body"].read()
            for o in listed
        }

    model = _tree(
        tmp_path / "model",
        {"config.json": b"{}", "model.safetensors": b"w" * 5000, "old-shard.bin": b"old"},
    )
    dest = f"s3://{s3}/exports/run2"
    export(model, None, dest)
    key = f"{prefix}model/model.safetensors"
    head = client.head_object(Bucket=s3, Key=key)
    client.put_object(Bucket=s3, Key=key, Body=b"x" * 5000, Metadata=head.get("Metadata", {}))
    (model / "old-shard.bin").unlink()
    again = export(model, None, dest)
    assert again["uploaded"] == ["model/model.safetensors", MANIFEST]
    assert again["deleted"] == ["model/old-shard.bin"]
    exported = objects()
    assert json.loads(exported.pop(MANIFEST))["files"].keys() == exported.keys()
    assert exported == {"model/config.json": b"{}", "model/model.safetensors": b"w" * 5000}
    client.put_object(Bucket=s3, Key=f"{prefix}model/extra.bin", Body=b"kept")
    before = objects()
    with pytest.raises(GrailError, match=r"no export here wrote \(model/extra.bin, 1 in all\)"):
        export(model, None, dest, keep_stale=True)
    assert objects() == before and before["model/extra.bin"] == b"kept"


def test_export_multipart_etags_match_what_the_store_reports(s3, tmp_path, monkeypatch):
    import grail.export.stage as export_module

    monkeypatch.setattr(export_module, "PART", 5 * 1024 * 1024)  # S3's smallest part
    model = _tree(tmp_path / "model", {"model.safetensors": b"a" * (11 * 1024 * 1024)})
    first = export(model, None, f"s3://{s3}/exports/big")
    assert "model/model.safetensors" in first["uploaded"]
    assert export(model, None, f"s3://{s3}/exports/big")["uploaded"] == []


def test_export_to_a_missing_bucket_is_one_line(s3, tmp_path, capsys):
    from grail.cli import main

    model = _tree(tmp_path / "model", {"config.json": b"{}"})
    status = main(["export", "--model", str(model), "--dest", "s3://no-such-bucket/x"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and "no-such-bucket" in err


def test_export_to_a_folder(tmp_path):
    model = _tree(tmp_path / "model", {"config.json": b"{}"})
    assert export(model, None, str(tmp_path / "out"))["uploaded"] == ["model/config.json", MANIFEST]
    assert export(model, None, str(tmp_path / "out"))["uploaded"] == []


def test_kfp_plugin_run_is_used_as_the_stage_run(monkeypatch, tmp_path):
    from mlflow.tracking import MlflowClient

    from grail.core import tracking

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("e", str(tmp_path / "a"))).info.run_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("KFP_MLFLOW_CONFIG", "{}")
    monkeypatch.setenv("MLFLOW_RUN_ID", run)
    assert tracking.start_pipeline_run("e", "grail-x", {}, {}) == ""
    with tracking.stage_run("", "clean", {"seed": 3}) as stage:
        assert stage == run
    assert client.get_run(run).data.params == {"seed": "3"}


@pytest.mark.parametrize("before", [None, "7"])
def test_trainer_params_off_restores_the_environment(monkeypatch, before):
    """The train task silences transformers' params only while it trains: `grail train` in the
    same process afterwards (and a user's own setting) keep theirs."""
    from grail.core import tracking

    if before is None:
        monkeypatch.delenv("MLFLOW_MAX_LOG_PARAMS", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_MAX_LOG_PARAMS", before)
    with pytest.raises(RuntimeError), tracking.trainer_params_off():
        assert os.environ["MLFLOW_MAX_LOG_PARAMS"] == "0"
        raise RuntimeError("training failed")
    assert os.environ.get("MLFLOW_MAX_LOG_PARAMS") == before


S3_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="module")
def export_bucket(s3_server):
    """A bucket on moto's S3 server for the local run's exports; yields a client and its name."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3_server,
        aws_access_key_id=S3_ENVIRONMENT["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_ENVIRONMENT["AWS_SECRET_ACCESS_KEY"],
        region_name=S3_ENVIRONMENT["AWS_DEFAULT_REGION"],
    )
    client.create_bucket(Bucket="grail-local-run")
    return client, "grail-local-run"


def test_the_dag_runs_every_issue_with_every_algorithm_and_compares_per_issue():
    """What the local run leaves to the compiled DAG (it runs gun control alone): both issues by
    default, handed to start-tracking, whose branches (every issue with every algorithm) are the
    items of each per-branch ParallelFor; each loop's benchmark results collected by one
    compare task after it (the comparison pairs the algorithms per issue:
    tests/test_compare.py)."""
    from grail.core.recipes import branches

    spec, _ = _documents()
    defaults = spec["root"]["inputDefinitions"]["parameters"]
    assert defaults["issues"]["defaultValue"] == ["gun_control", "minimum_wage"]
    assert defaults["algorithms"]["defaultValue"] == ["grpo", "grail"]
    tasks = {
        name: task
        for component in spec["components"].values()
        for name, task in component.get("dag", {}).get("tasks", {}).items()
    }
    given = tasks["start-tracking"]["inputs"]["parameters"]
    assert given["issues"]["componentInputParameter"] == "pipelinechannel--issues"
    assert given["algorithms"]["componentInputParameter"] == "pipelinechannel--algorithms"
    loops = {n: t for n, t in tasks.items() if "parameterIterator" in t}
    assert len(loops) == 4  # pod or TrainJob x generate or not: one DAG copy each
    for loop in loops.values():
        items = loop["parameterIterator"]["items"]["inputParameter"]
        assert items == "pipelinechannel--start-tracking-branches"
    compares = [t for n, t in tasks.items() if n.startswith("compare")]
    assert len(compares) == 4 and all(
        len(t["dependentTasks"]) == 1 and t["dependentTasks"][0] in loops for t in compares
    )
    assert branches(["gun_control", "minimum_wage"], ["grpo", "grail"]) == [
        {"issue": i, "algorithm": a}
        for i in ("gun_control", "minimum_wage")
        for a in ("grpo", "grail")
    ]


@pytest.fixture(scope="module")
def local_run(mlflow_server, s3_server, export_bucket, tmp_path_factory):
    """`grail run --local` on gun control (what `make demo` runs), against a real MLflow server,
    exporting to S3 (moto's server), where a server takes a model version's source (it refuses
    a local folder, see test_registry.py), and the counterfactual task: the finished process and
    its --outputs folder (one run for the tests below). Both issues' branches and comparisons
    are checked on the compiled DAG (test_the_dag_runs_every_issue_with_every_algorithm_and_
    compares_per_issue): a second issue here cost CI minutes for the same code path."""
    outputs = tmp_path_factory.mktemp("local-run")
    env = os.environ | S3_ENVIRONMENT | {"AWS_ENDPOINT_URL": s3_server}
    env |= {"MLFLOW_TRACKING_URI": mlflow_server, "PYTHONUNBUFFERED": "1"}
    destination = f"s3://{export_bucket[1]}/exports"
    done = subprocess.run(
        [sys.executable, "-m", "grail.cli", "run", "--local", "--outputs", str(outputs)]
        + ["--issue", "gun_control"]
        + ["--export-destination", destination]
        # and the counterfactual task (make demo-counterfactual's), on a few viewers
        + ["--counterfactual-viewers", "4"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, outputs


@pytest.mark.slow
def test_local_pipeline_run_builds_the_mlflow_hierarchy(local_run, mlflow_server, export_bucket):
    from mlflow.tracking import MlflowClient

    done, tmp_path = local_run
    out = done.stdout
    # Quiet: a line per task, the closing table, where things are; kfp.local's output in the log
    # (the progress lines while tasks run depend on the machine's speed: not counted). 99 lines
    # with 4 branches (measured 2026-11-29: each branch's promote task, exported step and gate).
    quiet = [line for line in out.splitlines() if not line.startswith("  ... running:")]
    assert len(quiet) < 70 and "executor_input" not in out, out
    assert out.count("not promoted: no better than always-first") == 2, out
    assert out.count("  exported: step ") == 2, out
    # every branch says whether RL had signal, and its normalised score (2 branches)
    assert out.count("  RL had ") == 2 and out.count("normalised score") == 2, out
    # GRAIL's states its discriminator's weight at step 1, and why when pre-training left it 0
    assert re.search(
        r"GAIL's weight (0 at step 1 \(after pre-training, its balanced accuracy on \d+ "
        r"held-out pairs was [0-9.]+: not above chance by a standard error\)|(?!0 )[0-9.e-]+ "
        r"at step 1), ",
        out,
    ), out
    assert "train            gun_control grpo     SUCCESS" in out and "best baseline" in out
    assert "train            gun_control grail    SUCCESS" in out and "grail-grpo" in out
    assert "MLflow runs: " + mlflow_server in out and (tmp_path / "pipeline.log").is_file()
    # the tiny-models task cloned gun control once; both branches adopted it (sft_reuse)
    log = (tmp_path / "pipeline.log").read_text()
    assert log.count("SFT warm start adopted from") == 2 and "not adopted" not in log
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("grail-local")
    assert f"#/experiments/{experiment.experiment_id}/runs?viewStateShareKey=" in out
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    params = parent.data.params
    run = parent.data.tags["kfp_run_id"]  # the local run's id names its folder and exports
    assert (tmp_path / "pipeline_root" / f"grail-grpo+grail-{run}").is_dir()
    assert f"local run {run} (grpo and grail)" in out
    assert parent.info.run_name == f"grail-tiny-grpo+grail-{run}"
    # the model-training view, not the GenAI one MLflow 3 opens by default
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert params["runner"] == "kfp.local subprocess" and "image" not in params
    note = parent.data.tags["mlflow.note.content"]
    assert f"**grail run {run}**: grpo and grail on gun_control" in note
    assert note.count("| gun_control | ") == 2 and note.count("[report](#/experiments/") == 2
    assert parent.data.tags["gun_control/grpo/best_baseline"] in ("ranker", "always_first")
    assert params["recipe"] == "recipes/tiny/config_{algorithm}.yaml"
    assert params["algorithms"] == "grpo,grail"
    assert params["issues"] == "gun_control" and params["learning_rate"]
    assert params["base_model"].startswith("tiny") and params["dataset_fingerprint"]
    assert parent.data.tags["kfp_run_id"] and parent.data.tags["git_commit"]
    for issue in ("gun_control",):
        for algorithm in ("grpo", "grail"):
            for field in ("accuracy", "ci_low", "log_loss", "start_log_loss", "best_step"):
                assert f"{issue}/{algorithm}/{field}" in parent.data.metrics, (issue, field)
        assert f"compare/{issue}/grail_minus_grpo/log_loss" in parent.data.metrics
    compared = {a.path for a in client.list_artifacts(parent.info.run_id, "compare")}
    assert compared == {"compare/comparison.json", "compare/comparison.md"}
    assert parent.info.status == "FINISHED"
    children = {
        r.info.run_name: r
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    expected = {"clean"} | {
        f"{stage}:{issue}:{algorithm}"
        for stage in ("train", "benchmark", "export")
        for issue in ("gun_control",)
        for algorithm in ("grpo", "grail")
    }
    assert expected <= set(children)
    train = children["train:gun_control:grail"]
    assert train.data.params["learning_rate"] and train.data.params["gail_use"] == "True"
    assert not any("/tmp" in v for v in train.data.params.values()), train.data.params
    assert "_name_or_path" not in train.data.params
    steps = [m.step for m in client.get_metric_history(train.info.run_id, "reward")]
    assert steps == list(range(1, DEMO_STEPS + 1))
    assert "gail/disc_loss" in train.data.metrics and "step_time" in train.data.metrics
    # TRL's own profiling series (a point per call) and the clip ratios that cannot move (one
    # step per batch) are out; each phase's seconds per step are in (grail.train.overrides)
    assert not [k for k in train.data.metrics if k.startswith(("profiling/Time", "clip_ratio/"))]
    assert "profiling/transformers.generate" in train.data.metrics, sorted(train.data.metrics)
    assert {d.dataset.name for d in train.inputs.dataset_inputs} == {
        "gun_control/train",
        "gun_control/validation",
    }
    # registered by the export, by reference: its source is the export, MLflow holds no copy
    (version,) = client.search_model_versions("name = 'grail-gun_control-grail'")
    s3, bucket = export_bucket
    where = f"s3://{bucket}/exports/{run}/grail/gun_control"
    assert version.source == where and version.tags["export_location"] == where
    assert version.run_id == train.info.run_id
    assert version.description.startswith(f"GRAIL on gun_control, pipeline run {run}.")
    exported = children["export:gun_control:grail"]
    assert exported.data.tags["model_version"] == f"models:/{version.name}/{version.version}"
    bench_id = children["benchmark:gun_control:grail"].info.run_id
    assert version.tags["source_run"] == train.info.run_id
    assert version.tags["benchmark_report"] == f"runs:/{bench_id}/benchmark/report.md"
    assert version.tags["data_fingerprint"] == params["dataset_fingerprint"]
    assert re.fullmatch(r"\[0\.\d{3}, [01]\.\d{3}\]", version.tags["accuracy_ci"])
    assert float(version.tags["log_loss"]) > 0
    bench = children["benchmark:gun_control:grail"]
    for key in (
        "trained/accuracy",
        "trained/log_loss",
        "baseline/ranker/accuracy",
        "baseline/ranker/log_loss",
        "ceiling/bayes_optimal/accuracy",
        "ceiling/bayes_optimal/log_loss",
    ):
        assert key in bench.data.metrics, key
    by_step = client.get_metric_history(bench.info.run_id, "trained_by_step/log_loss")
    # step 0: the starting model; the demo saves halfway and at the end
    assert sorted(m.step for m in by_step) == [0, DEMO_STEPS // 2, DEMO_STEPS]
    assert children["clean"].data.metrics["rows_kept"] > 0
    audit = {a.path for a in client.list_artifacts(children["clean"].info.run_id, "audit")}
    assert "audit/audit.md" in audit
    exported = exported.info.run_id
    assert [a.path for a in client.list_artifacts(exported, "export")] == ["export/manifest.json"]
    for algorithm in ("grpo", "grail"):  # exports/RUN/ALGORITHM/ISSUE: an MLflow model
        key = f"exports/{run}/{algorithm}/gun_control/{MANIFEST}"
        manifest = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        assert {"MLmodel", "model/model.safetensors", "benchmark/report.md"} <= set(
            manifest["files"]
        )
    objects = s3.list_objects_v2(Bucket=bucket, Prefix="exports/")["Contents"]
    assert len([o for o in objects if o["Key"].endswith(".safetensors")]) == 2  # one per branch
    stored = [
        path
        for r in runs
        for path in _artifact_paths(client, r.info.run_id)
        if path.endswith((".safetensors", "MLmodel"))
    ]
    assert not stored, stored


@pytest.mark.slow
def test_the_counterfactual_task_reports_each_branch_to_mlflow(local_run, mlflow_server):
    """With --counterfactual-viewers, each branch's counterfactual task runs in the DAG after
    its benchmark task: its report (truth beside every simulator, then people beside them on the
    replayed arm) is listed, its effects' errors, differences from people and verdicts reach
    the parent MLflow run, and each branch has its stage run."""
    from mlflow.tracking import MlflowClient

    done, _ = local_run
    assert "counterfactual   gun_control grail    SUCCESS" in done.stdout
    reports = re.findall(r"counterfactual  (\S+report\.md)", done.stdout)
    assert len(reports) == 2, done.stdout[-3000:]
    report = Path(reports[0]).read_text()
    assert "| recommender | truth | position_prior | ranker | step_0 |" in report
    assert "| outcome | people | truth | position_prior | ranker | step_0 |" in report
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("grail-local")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    effect = "random-cross_cutting"
    for issue in ("gun_control",):
        for algorithm in ("grpo", "grail"):
            assert f"cf/{issue}/{algorithm}/slant_error/{effect}" in parent.data.metrics
            for baseline in ("position_prior", "ranker"):
                gap = f"cf/{issue}/{algorithm}/opinion_shift_gap_vs_{baseline}/{effect}"
                assert gap in parent.data.metrics, gap
        assert f"cf/{issue}/position_prior/opinion_shift_error/{effect}" in parent.data.metrics
        assert f"cf/{issue}/grpo/like_minded_gap_vs_ranker/random" in parent.data.metrics
        assert f"cf/{issue}/ranker/like_minded_error/factual" in parent.data.metrics
        # the replayed arm against people's own sessions
        assert f"cf/{issue}/truth/first_slot_vs_people" in parent.data.metrics
        assert f"cf/{issue}/grail/popularity_gap_vs_ranker/people" in parent.data.metrics
    stage = next(r for r in runs if r.info.run_name == "counterfactual:gun_control:grpo")
    assert f"cf/gun_control/grpo/slant_error/{effect}" in stage.data.metrics
    own = {a.path for a in client.list_artifacts(stage.info.run_id, "counterfactual")}
    assert own == {"counterfactual/gun_control-grpo.md", "counterfactual/outcomes.svg"}
    names = {r.info.run_name for r in runs}
    assert {"counterfactual:gun_control:grpo", "counterfactual:gun_control:grail"} <= names
    note = parent.data.tags["mlflow.note.content"]  # the description links each report
    assert note.count("counterfactual/gun_control-grpo.md)") == 1 and "truth beside" in note
    shared = {a.path for a in client.list_artifacts(parent.info.run_id, "counterfactual")}
    assert "counterfactual/gun_control-grail.md" in shared


def _artifact_paths(client, run_id: str, folder: str | None = None) -> list[str]:
    """Every artifact of a run, recursively."""
    paths = []
    for item in client.list_artifacts(run_id, folder):
        paths += _artifact_paths(client, run_id, item.path) if item.is_dir else [item.path]
    return paths


@pytest.mark.slow
def test_the_demo_answers_did_training_help(local_run):
    """The local run's branches (issue x algorithm; `make demo` runs gun control's): the final
    model's log-loss beats step 0's with a participant-bootstrap interval that excludes zero,
    its accuracy is not below the lower bound of always-first's interval, and no system is
    flagged as collapsed."""
    _, outputs = local_run
    found = sorted((outputs / "pipeline_root").glob("*/*/benchmark-*/results/metrics.json"))
    branches = {}
    for path in found:
        metrics = json.loads(path.read_text())
        branches[(metrics["branch"]["issue"], metrics["branch"]["algorithm"])] = metrics
    assert sorted(branches) == [("gun_control", "grail"), ("gun_control", "grpo")]
    for branch, metrics in branches.items():
        change = metrics["differences"]["final_minus_start"]["log_loss"]
        assert change["ci"][1] < 0, (branch, change)
        final = metrics["systems"][f"{metrics['trained']}@step-{DEMO_STEPS}"]
        assert final["accuracy"] >= metrics["systems"]["always_first"]["ci_low"], branch
        flagged = {n: s["collapsed"] for n, s in metrics["systems"].items() if s.get("collapsed")}
        assert not flagged, (branch, flagged)


@pytest.mark.slow
@pytest.mark.skipif(
    browser.chromium() is None,
    reason="no Chromium on PATH: make test-integration installs Debian's chromium when run as root "
    "(CI); as another user: apt-get install chromium",
)
def test_what_a_user_sees_in_mlflow_in_a_real_browser(local_run, mlflow_server):
    """The MLflow UI in headless Chromium, as a user opens it from the printed link: the
    runs page in the model-training view with the headline columns and readable run names;
    the parent run's description with its table; a model version's description and tags.
    Screenshots land in the run's --outputs folder (ui-*.png)."""
    from mlflow.tracking import MlflowClient

    done, outputs = local_run
    (link,) = [
        line.split(": ", 1)[1] for line in done.stdout.splitlines() if "MLflow runs:" in line
    ]
    # wide enough for every column: the table renders only the columns in view
    runs_page = browser.text(browser.dump_dom(link, size="4200,1200"))
    browser.screenshot(link, outputs / "ui-runs.png")
    joined = " | ".join(runs_page)
    assert "grail headline" in joined and "Training runs" not in joined, joined[:2000]
    for column in ("gun_control/grpo/accuracy", "gun_control/grail/log_loss"):
        assert column in runs_page, (column, joined[:3000])
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("grail-local")
    (parent,) = client.search_runs(
        [experiment.experiment_id], "attributes.run_name LIKE 'grail-tiny-%'"
    )
    run_name = parent.info.run_name
    assert any(run_name in cell for cell in runs_page), joined[:3000]  # not cut to 18 chars
    accuracy = parent.data.metrics["gun_control/grpo/accuracy"]
    assert f"{accuracy:g}" in runs_page  # the value in its column, as logged (rounded)
    page = f"{mlflow_server}/#/experiments/{experiment.experiment_id}/runs/{parent.info.run_id}"
    dom = browser.dump_dom(page + "?workflowType=machine_learning")
    browser.screenshot(page + "?workflowType=machine_learning", outputs / "ui-parent.png")
    assert "<table" in dom and "best baseline" in " ".join(browser.text(dom))
    assert "Evaluations" not in browser.text(dom)
    (version,) = client.search_model_versions("name = 'grail-gun_control-grpo'")
    model_page = f"{mlflow_server}/#/models/grail-gun_control-grpo/versions/{version.version}"
    seen = " | ".join(browser.text(browser.dump_dom(model_page)))
    browser.screenshot(model_page, outputs / "ui-model-version.png")
    assert "GRPO on gun_control, pipeline run" in seen and "data_fingerprint" in seen, seen[:3000]


def test_submit_sends_namespace_root_account_and_auth_to_the_api(tmp_path, monkeypatch):
    """`grail submit` against a fake KFP API server that records the requests: the run and its
    experiment in the Profile namespace, the pipeline root and service account on the run, the
    bearer token and the session cookie as kfp.Client sends them, STRING parameters as text."""
    from fake_kfp import FakeKfp

    from grail.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))  # kfp.Client reads ~/.config/kfp/context.json
    (tmp_path / "token").write_text("tok-123\n")
    monkeypatch.setenv("KF_PIPELINES_COOKIE", "authservice_session=cookie-456")
    with FakeKfp() as fake:
        status = main(
            [
                "submit",
                str(COMPILED),
                "--host",
                fake.url,
                "--experiment",
                "grail-exp",
                "--namespace",
                "team-a",
                "--pipeline-root",
                "minio://mlpipeline/private-artifacts/team-a/v2/artifacts",
                "--service-account",
                "default-editor",
                "--token-file",
                str(tmp_path / "token"),
                "--run-name",
                "r1",
                "--param",
                "gpu_count=8",
                "--param",
                'issues=["gun_control"]',
            ]
        )
    assert status == 0
    posts = {r["path"]: r for r in fake.requests if r["method"] == "POST"}
    experiment = posts["/apis/v2beta1/experiments"]["body"]
    assert experiment["display_name"] == "grail-exp" and experiment["namespace"] == "team-a"
    run = posts["/apis/v2beta1/runs"]
    body = run["body"]
    assert body["display_name"] == "r1" and body["experiment_id"] == "exp-1"
    assert body["service_account"] == "default-editor"
    config = body["runtime_config"]
    assert config["pipeline_root"] == "minio://mlpipeline/private-artifacts/team-a/v2/artifacts"
    assert config["parameters"]["gpu_count"] == "8"  # a STRING parameter stays text
    assert config["parameters"]["issues"] == ["gun_control"]
    # 8 GPUs without train_cpu/train_memory: the pod sized for 8 ranks, not the 1-GPU default.
    assert (config["parameters"]["train_cpu"], config["parameters"]["train_memory"]) == (
        "48",
        "192Gi",
    )
    spec = body["pipeline_spec"]
    assert spec.get("pipeline_spec", spec)["pipelineInfo"]["name"] == "grail"
    assert "platform_spec" in spec  # the kfp-kubernetes settings travel with the run
    for request in fake.requests:
        headers = {k.lower(): v for k, v in request["headers"].items()}
        assert headers.get("authorization") == "Bearer tok-123", request["path"]
        assert "authservice_session=cookie-456" in headers.get("cookie", ""), request["path"]


def test_submit_errors_are_one_line_with_status_2(tmp_path, monkeypatch, capsys):
    from grail.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))
    port = free_port()  # nothing listens there
    status = main(["submit", "--host", f"http://127.0.0.1:{port}", "--experiment", "e"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and err.startswith("grail: error: submit")
    status = main(["submit", "--host", "http://x", "--experiment", "e", "--param", "nope=1"])
    assert status == 2 and "nope" in capsys.readouterr().err


def test_the_benchmark_has_a_gpu_pool_of_its_own_defaulting_to_trainings():
    """benchmark_gpu_type/_count/_node_selector/_tolerations place the benchmark (an inference
    pool); their defaults are the training pool's."""
    pipeline_spec, platform_spec = _documents()
    executors = pipeline_spec["deploymentSpec"]["executors"]
    kubernetes = platform_spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    launchers = _launchers(pipeline_spec)
    for prefix, wanted in (("exec-train", ""), ("exec-benchmark", "benchmark_")):
        # with/without generate, training in its pod (a TrainJob's launcher has no GPU)
        for name in [n for n in executors if n.startswith(prefix) and n not in launchers]:
            accelerator = executors[name]["container"]["resources"]["accelerator"]
            assert f"pipelinechannel--{wanted}gpu_type" in accelerator["resourceType"], name
            assert f"pipelinechannel--{wanted}gpu_count" in accelerator["resourceCount"], name
            selector = kubernetes[name]["nodeSelector"]["nodeSelectorJson"][
                "componentInputParameter"
            ]
            toleration = kubernetes[name]["tolerations"][0]["tolerationJson"]
            assert (
                selector.endswith(f"-{wanted}node_selector") or selector == f"{wanted}node_selector"
            )
            assert toleration["componentInputParameter"].endswith(f"{wanted}tolerations")
    defaults = pipeline_spec["root"]["inputDefinitions"]["parameters"]
    for field in ("gpu_type", "gpu_count", "node_selector", "tolerations"):
        assert defaults[f"benchmark_{field}"]["defaultValue"] == defaults[field]["defaultValue"]


def test_train_backend_trainjob_launches_from_a_light_pod():
    """train_backend=trainjob: the branch's train task runs on the light CPU pod with the
    pool's settings as inputs (the TrainJob gets them), the pod branch keeps the GPU pool;
    both with and without generate."""
    pipeline_spec, platform_spec = _documents()
    executors = pipeline_spec["deploymentSpec"]["executors"]
    launchers = _launchers(pipeline_spec)
    assert len(launchers) == 2  # with and without generate
    kubernetes = platform_spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name in launchers:
        container = executors[name]["container"]
        assert "accelerator" not in container.get("resources", {})
        assert container["image"] == "{{$.inputs.parameters['pipelinechannel--image']}}"
        assert "nodeSelector" not in kubernetes[name] and "tolerations" not in kubernetes[name]
        assert len(kubernetes[name]["secretAsEnv"]) == 2
    components = pipeline_spec["components"]
    tasks = [
        task
        for component in components.values()
        for task in component.get("dag", {}).get("tasks", {}).values()
        if task["taskInfo"]["name"] in ("train", "train (TrainJob)")
    ]
    assert len(tasks) == 4
    for task in tasks:
        inputs = task["inputs"]["parameters"]
        backend = inputs["backend"]
        if task["taskInfo"]["name"] == "train (TrainJob)":
            assert backend["runtimeValue"]["constant"] == "trainjob"
        else:  # the pod branch passes the parameter: a wrong value fails there, named
            assert backend["componentInputParameter"].endswith("train_backend")
        for name in ("nodes", "node_selector", "tolerations", "gpu_count", "train_image"):
            assert "componentInputParameter" in inputs[name], name
    conditions = [
        task["triggerPolicy"]["condition"]
        for component in components.values()
        for task in component.get("dag", {}).get("tasks", {}).values()
        if task["taskInfo"]["name"] in ("trainjob", "pod")
    ]
    assert len(conditions) == 4 and all("train_backend" in c for c in conditions)
    defaults = pipeline_spec["root"]["inputDefinitions"]["parameters"]
    assert defaults["train_backend"]["defaultValue"] == "pod"
    assert defaults["train_nodes"]["defaultValue"] == 1


def _tasks(pipeline_spec) -> list[dict]:
    return [
        task
        for component in pipeline_spec["components"].values()
        for task in component.get("dag", {}).get("tasks", {}).values()
    ] + list(pipeline_spec["root"]["dag"]["tasks"].values())


def test_the_summarize_dag_runs_the_same_components_as_the_summarize_task():
    """pipelines/summarize.yaml: the slate DAG's components with task=summarize where the
    task changes what they do; one branch per algorithm and no comparison; the training pod
    gets the OpenAI key too (an API reader rewards it); its default recipe is shipped and of
    the summarize task."""
    from grail.core.recipes import read_recipe, resolve_recipe

    pipeline_spec, platform_spec = _documents(SUMMARIZE)
    tasks = _tasks(pipeline_spec)
    names = {t["taskInfo"]["name"] for t in tasks}
    assert {"clean", "tiny-models", "train", "benchmark", "export"} <= names
    assert "compare" not in names and "generate" in names  # a teacher's warm start, switched
    generate = next(t for t in tasks if t["taskInfo"]["name"] == "generate")
    prompt = generate["inputs"]["parameters"]["prompt"]["componentInputParameter"]
    assert prompt == "pipelinechannel--generate_prompt"  # the root parameter, into the branch
    for task in tasks:
        if task["taskInfo"]["name"] in ("clean", "tiny-models", "benchmark"):
            task_input = task["inputs"]["parameters"]["task"]
            assert task_input["runtimeValue"]["constant"] == "summarize", task["taskInfo"]
    start = next(t for t in tasks if t["taskInfo"]["name"] == "start-tracking")
    given = start["inputs"]["parameters"]
    # the task is passed as the task, not as an issue: its branches' subject comes from it
    assert given["issues"]["runtimeValue"]["constant"] == []
    assert given["task"]["runtimeValue"]["constant"] == "summarize"
    root = pipeline_spec["root"]["inputDefinitions"]["parameters"]
    assert root["seed"]["defaultValue"] == 80 and root["validation_documents"]["defaultValue"] == 91
    assert root["algorithms"]["defaultValue"] == ["grpo"]
    recipe = resolve_recipe(root["recipe"]["defaultValue"], "summarize", "grpo")
    assert read_recipe(recipe)["task"] == "summarize"
    kubernetes = platform_spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    launchers = _launchers(pipeline_spec)
    pods = [n for n in kubernetes if n.startswith("exec-train") and n not in launchers]
    assert pods
    for name in pods:
        secrets = {
            s["secretNameParameter"]["componentInputParameter"]
            for s in kubernetes[name]["secretAsEnv"]
        }
        assert len(secrets) == 3, name
    slate_names = {t["taskInfo"]["name"] for t in _tasks(_documents()[0])}
    assert "compare" in slate_names  # the slate DAG keeps its comparison


def test_a_recipe_of_the_other_task_is_refused_before_anything_runs():
    from grail.components.tracking.task import check_run

    from grail.core.errors import GrailError

    with pytest.raises(GrailError, match="a recipe of task slate in the summarize task's"):
        check_run(
            "recipes/tiny/config_{algorithm}.yaml", "", ["summarize"], ["grpo"], {}, "summarize"
        )
    with pytest.raises(GrailError, match="a recipe of task summarize in the slate task's"):
        check_run("recipes/tiny/config_summarize.yaml", "", ["gun_control"], ["grpo"], {})
    check_run("recipes/tiny/config_summarize.yaml", "", ["summarize"], ["grpo"], {}, "summarize")


def test_the_counterfactual_task_runs_after_each_benchmark_on_its_pool_with_the_clis_defaults():
    """The slate DAG's counterfactual task: in every branch, behind its viewers > 0 condition,
    on the benchmark's pool (GPU, the training image), its defaults grail counterfactual's own
    (the DAG's module loads no stage, so they are written twice)."""
    from grail.tasks.slate.counterfactual.config import CounterfactualConfig
    from grail.tasks.slate.counterfactual.recommenders import RECOMMENDERS

    pipeline_spec, _ = _documents()
    executors = pipeline_spec["deploymentSpec"]["executors"]
    rolled = [name for name in executors if name.startswith("exec-counterfactual")]
    benchmarks = [name for name in executors if name.startswith("exec-benchmark")]
    assert rolled and len(rolled) == len(benchmarks)
    for name in rolled:
        accelerator = executors[name]["container"]["resources"]["accelerator"]
        assert "pipelinechannel--benchmark_gpu_type" in accelerator["resourceType"], name
        assert executors[name]["container"]["image"].endswith("train_image']}}"), name
    components = pipeline_spec["components"]
    holding = {  # the condition groups that hold a counterfactual task
        name for name, spec in components.items()
        if any(t["componentRef"]["name"].startswith("comp-counterfactual")
               for t in spec.get("dag", {}).get("tasks", {}).values())
    }  # fmt: skip
    dags = [spec.get("dag", {}).get("tasks", {}) for spec in components.values()]
    tasks = [task for dag in dags for task in dag.values()]
    guarded = [task for task in tasks if task["componentRef"]["name"] in holding]
    assert len(guarded) == len(rolled)
    for task in guarded:  # each runs after its branch's benchmark
        assert any(d.startswith("benchmark") for d in task["dependentTasks"]), task
    defaults = pipeline_spec["root"]["inputDefinitions"]["parameters"]
    config = CounterfactualConfig(data="d", out="o")
    assert defaults["counterfactual_viewers"]["defaultValue"] == config.viewers
    assert defaults["counterfactual_steps"]["defaultValue"] == config.steps
    assert defaults["counterfactual_recommenders"]["defaultValue"] == list(RECOMMENDERS)
    from grail.clean.config import CleanConfig

    cleaned = CleanConfig(raw="r", out="o")  # the study's defaults, written in the task's DAG
    assert defaults["seed"]["defaultValue"] == cleaned.seed
    assert defaults["validation_fraction"]["defaultValue"] == cleaned.validation_fraction
    text = COMPILED.read_text()
    assert "pipelinechannel--counterfactual_viewers" in text and "condition" in text
    summarize = yaml.safe_load_all(SUMMARIZE.read_text())
    assert "counterfactual" not in json.dumps(next(summarize))  # a slate-task stage
