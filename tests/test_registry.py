"""Models registered by reference: the export task makes the exported folder an MLflow model and
registers it with the export as the version's source, so MLflow holds no copy of the weights.
Against a real `mlflow server` on 127.0.0.1 and S3 through moto's server, and the local folder
and sqlite store that `grail run --local` uses by default."""

from __future__ import annotations

import json
import logging
import re
import sys
import uuid
from pathlib import Path

import pytest
from grail.components.benchmark.task import benchmark_task
from grail.components.export.task import export_location, export_task
from grail.components.promote.task import gate
from grail.components.train.task import log_training
from ports import free_port, start_server, stop_server

from grail.clean.stage import fingerprint
from grail.core import tracking
from grail.core.outputs import mark_complete
from grail.core.run_notes import registered_model_name

ISSUE = "gun_control"


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory):
    """A real `mlflow server` with a sqlite backend; yields its URL and its artifact folder."""
    folder = tmp_path_factory.mktemp("registry-mlflow")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{folder / 'db.sqlite'}"]
    command += ["--artifacts-destination", str(folder / "artifacts")]
    server = start_server(command, f"{url}/health", "mlflow server", log=folder / "server.log")
    yield url, folder / "artifacts"
    stop_server(server)


@pytest.fixture
def server(tracking_server, monkeypatch):
    url, artifacts = tracking_server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    return artifacts


def branch(run, algorithm, destination, model, data, tmp_path, kfp_run=None, rule=None) -> dict:
    """One branch of a pipeline run as the DAG runs it after training: the parent run (with
    the data fingerprint the clean task logs), the train stage's run (its dataset inputs), the
    benchmark task, the promotion gate under `rule` (none: no gate) and the export task.
    `kfp_run`: the KFP run's id, `run` its name by default. Returns the run ids and where the
    export went."""
    parent = tracking.start_pipeline_run(
        "grail-registry",
        f"grail-test-{run}",
        {"dataset_fingerprint": fingerprint(data)},
        {"kfp_run_id": kfp_run or run},
    )
    with tracking.stage_run(parent, f"train:{ISSUE}:{algorithm}") as train_run:
        log_training(train_run, Path(model), Path(data), ISSUE, algorithm)
    folder = tmp_path / f"{kfp_run or run}-{uuid.uuid4().hex[:6]}" / algorithm  # a try's own
    results = str(folder / "results")
    benchmark_task(
        dataset=str(data), model=str(model), base_models="", issue=ISSUE, algorithm=algorithm,
        references="", limit=4, reads_rows=4, max_new_tokens=8, parent=parent, out=results,
        task="slate",
    )  # fmt: skip
    manifest = str(folder / "manifest.json")
    decision = str(folder / "decision.json") if rule else None
    if rule:
        gate(results, rule, decision)
    export_task(
        model=str(model), results=results, destination=destination, run=run, issue=ISSUE,
        algorithm=algorithm, parent=parent, out=manifest, decision=decision,
    )  # fmt: skip
    return {
        "parent": parent,
        "train": train_run,
        "where": export_location(destination, run, algorithm, ISSUE),
        "results": results,
        "decision": decision,
    }


def version_of(export_where: str, algorithm: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    name = registered_model_name(ISSUE, algorithm)
    (version,) = [
        v for v in client.search_model_versions(f"name = '{name}'") if v.source == export_where
    ]
    return version


def loads_and_generates(uri: str) -> None:
    import mlflow.transformers

    generator = mlflow.transformers.load_model(uri)
    (answer,) = generator("Which video next?", max_new_tokens=4, do_sample=False)
    assert answer["generated_text"].startswith("Which video next?")


def artifacts_in_mlflow() -> list[str]:
    """Every artifact path of every run of every experiment, recursively."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()

    def below(run_id, path=None):
        for item in client.list_artifacts(run_id, path):
            yield from below(run_id, item.path) if item.is_dir else [item.path]

    experiments = [e.experiment_id for e in client.search_experiments()]
    return [path for run in client.search_runs(experiments) for path in below(run.info.run_id)]


def weights_in_bucket(bucket: str) -> list[str]:
    import boto3

    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket)
    keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
    return [key for key in keys if key.endswith(".safetensors")]


@pytest.mark.slow
def test_an_s3_export_is_the_model_versions_source_and_mlflow_holds_no_copy(
    server, s3, tiny_policy, small_clean, tmp_path
):
    from mlflow.tracking import MlflowClient

    destination = f"s3://{s3}/exports"
    ran = branch("run-1", "grpo", destination, tiny_policy, small_clean, tmp_path)
    where = f"s3://{s3}/exports/run-1/grpo/{ISSUE}"
    assert ran["where"] == where
    version = version_of(where, "grpo")
    assert version.source == where and version.run_id == ran["train"]
    assert version.description.startswith(f"GRPO on {ISSUE}, pipeline run run-1.")
    client = MlflowClient()
    stages = {
        r.info.run_name: r
        for r in client.search_runs(
            [client.get_run(ran["parent"]).info.experiment_id],
            f"tags.mlflow.parentRunId = '{ran['parent']}'",
        )
    }
    benchmark = stages[f"benchmark:{ISSUE}:grpo"].info.run_id
    tags = version.tags
    assert tags["export_location"] == where and tags["source_run"] == ran["train"]
    assert tags["benchmark_run"] == benchmark
    assert tags["benchmark_report"] == f"runs:/{benchmark}/benchmark/report.md"
    assert tags["data_fingerprint"] == fingerprint(small_clean)
    assert tags["kfp_run_id"] == "run-1" and tags["issue"] == ISSUE and tags["algorithm"] == "grpo"
    assert re.fullmatch(r"\[0\.\d{3}, [01]\.\d{3}\]", tags["accuracy_ci"])
    assert {"accuracy", "log_loss", "best_baseline"} <= set(tags)
    model_uri = f"models:/{version.name}/{version.version}"
    exported = stages[f"export:{ISSUE}:grpo"]
    assert exported.data.tags["model_version"] == model_uri
    assert {d.dataset.name for d in stages[f"train:{ISSUE}:grpo"].inputs.dataset_inputs} == {
        f"{ISSUE}/train",
        f"{ISSUE}/validation",
    }
    loads_and_generates(model_uri)  # the weights come from moto's S3, through AWS_ENDPOINT_URL
    paths = artifacts_in_mlflow()
    assert "benchmark/report.md" in paths  # the listing sees the runs' artifacts
    assert not [p for p in paths if p.endswith((".safetensors", "MLmodel"))], paths
    assert not list(server.rglob("*.safetensors"))
    assert weights_in_bucket(s3) == [f"exports/run-1/grpo/{ISSUE}/model/model.safetensors"]


@pytest.mark.slow
def test_two_runs_and_two_algorithms_register_versions_that_each_load(
    server, s3, tiny_policy, small_clean, tmp_path
):
    destination = f"s3://{s3}/exports"
    versions = []
    for run, algorithm in (("run-a", "grpo"), ("run-b", "grpo"), ("run-b", "grail")):
        ran = branch(run, algorithm, destination, tiny_policy, small_clean, tmp_path)
        versions.append(version_of(ran["where"], algorithm))
    assert len({v.source for v in versions}) == 3
    first, second, other = versions
    assert first.name == second.name and int(second.version) == int(first.version) + 1
    assert other.name == registered_model_name(ISSUE, "grail")
    for version in versions:
        loads_and_generates(f"models:/{version.name}/{version.version}")
    assert len(weights_in_bucket(s3)) == 3  # one copy per export, none twice
    assert not list(server.rglob("*.safetensors"))


@pytest.mark.slow
def test_a_later_run_under_the_same_name_never_changes_a_registered_export(
    server, s3, tiny_policy, small_clean, tmp_path
):
    """A second pipeline run with the same run name and destination (the gate said
    ``never``) would re-export in place, under the champion's alias: it is refused before
    anything moves, the export keeps its bytes and manifest, and the source backs one version,
    still the champion. A retry of the first run's export task reuses its version."""
    import boto3
    from mlflow.tracking import MlflowClient

    from grail.core.errors import GrailError

    destination = f"s3://{s3}/exports"
    ran = (tiny_policy, small_clean, tmp_path)
    first = branch("r1", "champ", destination, *ran, kfp_run="kfp-1", rule="always")
    client, name = MlflowClient(), registered_model_name(ISSUE, "champ")

    def stored():
        pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=s3)
        return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}

    before = stored()
    with pytest.raises(GrailError, match=r"already the source of models:/.*/1 \(pipeline run"):
        branch("r1", "champ", destination, *ran, kfp_run="kfp-2", rule="never")
    assert stored() == before
    versions = client.search_model_versions(f"name = '{name}'")
    assert [(v.version, v.source) for v in versions] == [("1", first["where"])]
    assert dict(client.get_registered_model(name).aliases) == {"champion": "1"}
    export_task(  # the first run's export task again, as a retry runs it
        model=str(tiny_policy), results=first["results"], destination=destination, run="r1",
        issue=ISSUE, algorithm="champ", parent=first["parent"],
        out=str(tmp_path / "retry.json"), decision=first["decision"],
    )  # fmt: skip
    assert len(client.search_model_versions(f"name = '{name}'")) == 1


@pytest.mark.slow
def test_the_demos_local_folder_and_sqlite_store_register_a_loadable_version(
    tiny_policy, small_clean, tmp_path, monkeypatch
):
    """`grail run --local` by default: a sqlite store MLflow opens itself, which takes a local
    folder as a source (only a server refuses one), and the export to OUTPUTS/export."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("GRAIL_MLFLOW_ARTIFACTS", (tmp_path / "mlflow-artifacts").as_uri())
    destination = str(tmp_path / "export")
    ran = branch("run-1", "grail", destination, tiny_policy, small_clean, tmp_path)
    source = f"file://{ran['where']}"
    version = version_of(source, "grail")
    assert version.tags["export_location"] == source
    loads_and_generates(f"models:/{version.name}/{version.version}")
    assert [p.name for p in Path(ran["where"]).rglob("*.safetensors")] == ["model.safetensors"]
    assert (Path(ran["where"]) / "MLmodel").is_file()
    assert not list((tmp_path / "mlflow-artifacts").rglob("*.safetensors"))


@pytest.mark.slow
def test_a_server_refuses_a_local_folder_and_the_export_says_so(
    server, tiny_policy, small_clean, tmp_path, caplog
):
    """MLflow's server takes a local source only inside the run's artifacts: the export is
    done, its folder an MLflow model, but no version is registered; a warning and the export
    run's tag say why."""
    from mlflow.tracking import MlflowClient

    caplog.set_level(logging.WARNING, logger="grail.core.run_notes")
    ran = branch("run-local", "grpo", str(tmp_path / "export"), tiny_policy, small_clean, tmp_path)
    source = f"file://{ran['where']}"
    client = MlflowClient()
    name = registered_model_name(ISSUE, "grpo")
    assert source not in {v.source for v in client.search_model_versions(f"name = '{name}'")}
    (exported,) = client.search_runs(
        [client.get_run(ran["parent"]).info.experiment_id],
        f"tags.mlflow.parentRunId = '{ran['parent']}' and "
        f"attributes.run_name = 'export:{ISSUE}:grpo'",
    )
    tag = exported.data.tags["model_version"]
    assert tag.startswith("not registered: the MLflow server") and "s3://" in tag
    assert f"{name}: not registered" in caplog.text
    loads_and_generates(ran["where"])


def test_a_dataset_insert_lost_to_a_concurrent_branch_is_tried_again(monkeypatch):
    """Two branches' train tasks of one issue log its rows as the same MLflow dataset, often at
    the same moment: the server looks the dataset up and inserts it in two statements, so one
    insert can fail on the dataset's unique key (a CI run lost a task to it). The server's
    answer, as CI recorded it, once: the input is logged on the second try. Another error is
    not retried."""
    import mlflow
    from grail.components.train.task import log_input
    from mlflow.exceptions import RestException

    lost = {
        "error_code": "BAD_REQUEST",
        "message": "(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, "
        "datasets.name, datasets.digest",
    }
    answers, logged = [RestException(lost)], []

    def log_input_once(dataset, context):
        if answers:
            raise answers.pop()
        logged.append((dataset, context))

    monkeypatch.setattr(mlflow, "log_input", log_input_once)
    log_input("rows", "training", pause=0.0)
    assert logged == [("rows", "training")]
    answers.append(RestException({"error_code": "PERMISSION_DENIED", "message": "no"}))
    with pytest.raises(RestException, match="no"):
        log_input("rows", "validation", pause=0.0)
    assert logged == [("rows", "training")]


@pytest.mark.integration
@pytest.mark.parametrize("task", ["slate", "summarize"])
def test_only_a_promoted_version_gets_the_champion_alias(server, tmp_path, task):
    """The promotion gate on constructed benchmarks of each task, its decision handed to the
    registry as the export hands it: a version that fails the gate is registered without the
    alias, one that passes gets ``champion``, and a later failure leaves the alias where it
    was; the export run and each version say why (real `mlflow server`)."""
    from constructed_benchmarks import slate_benchmark, summarize_benchmark
    from mlflow.tracking import MlflowClient

    from grail.benchmark.stage import headline
    from grail.export.registry import register_export

    issue = ISSUE if task == "slate" else "documents"
    results = (
        [slate_benchmark(0.008), slate_benchmark(-0.002), slate_benchmark(0.02)]
        if task == "slate"
        else [summarize_benchmark(0.58), summarize_benchmark(0.61), summarize_benchmark(0.5)]
    )
    algorithm = "gated"  # a registered model of its own: other tests here register versions
    client, name = MlflowClient(), registered_model_name(issue, algorithm)
    aliases, tags, versions = [], [], []
    for k, result in enumerate(results):
        parent = tracking.start_pipeline_run(
            f"grail-gate-{task}", f"run-{k}", {"task": task}, {"kfp_run_id": f"run-{k}"}
        )
        folder = tmp_path / f"results-{k}"
        folder.mkdir()
        (folder / "metrics.json").write_text(json.dumps(result))
        mark_complete(folder, "benchmark")
        decision = gate(folder, "beats_prior", tmp_path / f"decision-{k}.json")
        with tracking.stage_run(parent, f"export:{issue}:{algorithm}") as export_run:
            uri = register_export(
                export_run, issue, algorithm, f"s3://grail/exports/run-{k}/{algorithm}/{issue}",
                headline(result), decision,
            )  # fmt: skip
        version = client.get_model_version(name, uri.rsplit("/", 1)[1])
        versions.append(version.version)
        aliases.append(dict(client.get_registered_model(name).aliases))
        tags.append((client.get_run(export_run).data.tags["promoted"], version.tags["promoted"]))
        assert version.tags["promotion"].startswith(
            "promoted (champion): beats" if decision["promoted"] else "not promoted: no better"
        )
    passed = versions[1]
    assert aliases == [{}, {"champion": passed}, {"champion": passed}]
    assert tags == [("false", "false"), ("true", "true"), ("false", "false")]
