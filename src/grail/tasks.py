"""What each pipeline task does: one call per KFP component, the stage plus its MLflow run.

The components in ``components/`` are adapters: typed parameters and artifact paths in, one call
to a function here, metrics out. These functions hold the little glue a pipeline task needs
beyond the stage itself (resolving the recipe, the per-issue filter, tracking).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from grail import tracking
from grail.errors import GrailError

ISSUE_KEYS = {"gun_control": "gun", "minimum_wage": "wage"}


def resolve_recipe(recipe: str, issue: str, algorithm: str) -> Path:
    """A recipe path, with ``{issue}`` (gun/wage) and ``{algorithm}`` filled in, found relative
    to the working directory or ``GRAIL_HOME`` (the image's checkout)."""
    name = recipe.format(issue=ISSUE_KEYS.get(issue, issue), algorithm=algorithm)
    for root in (Path.cwd(), Path(os.environ.get("GRAIL_HOME", "/opt/grail"))):
        if (root / name).is_file():
            return root / name
    raise GrailError(f"recipe {name} not found (looked in {Path.cwd()} and GRAIL_HOME)")


def overrides_to_args(overrides: str) -> list[str]:
    """``{"max_steps": 10, "issues": ["a"]}`` -> ``["--max_steps", "10", "--issues", "a"]``."""
    values = json.loads(overrides or "{}")
    if not isinstance(values, dict):
        raise GrailError(f"recipe overrides must be a JSON object, got {overrides!r}")
    args = []
    for key, value in values.items():
        items = value if isinstance(value, list) else [value]
        args += [f"--{key}", *(json.dumps(v) if isinstance(v, bool) else str(v) for v in items)]
    return args


def fingerprint(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.parquet")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def start(experiment: str, recipe: str, kfp_run_id: str, image: str, algorithm: str) -> str:
    """The pipeline's parent MLflow run ("" when tracking is off or KFP's plugin tracks)."""
    return tracking.start_pipeline_run(
        experiment,
        {"kfp_run_id": kfp_run_id, "recipe": recipe, "image": image, "algorithm": algorithm},
    )


def clean_task(
    raw_uri: str,
    participants: int,
    seed: int,
    validation_fraction: float,
    parent: str,
    out: str,
    audit_markdown: str,
) -> dict:
    """Simulate a study when ``raw_uri`` is empty, else read the raw export; clean it."""
    from grail.clean import clean
    from grail.simulate import simulate
    from grail.storage import Location, download_folder

    params = {
        "raw_uri": raw_uri or f"synthetic:{participants}",
        "seed": seed,
        "validation_fraction": validation_fraction,
    }
    with tracking.stage_run(parent, "clean", params), tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw"
        if not raw_uri:
            simulate(raw, participants=participants or None, seed=seed)
        elif raw_uri.startswith("s3://"):
            download_folder(Location.parse(raw_uri), raw)
        else:
            raw = Path(raw_uri.removeprefix("file://"))
        report = clean(raw, out, validation_fraction=validation_fraction, seed=seed)
        shutil.copyfile(Path(out) / "audit.md", audit_markdown)
        accounting = report["accounting"]
        tracking.tag_parent(parent, {"dataset_fingerprint": fingerprint(Path(out))})
        _log_metrics(
            {
                "rows_kept": accounting["rows_kept"],
                "rows_in": accounting["rows_in"],
                "participants_kept": accounting["participants_kept"],
            }
        )
    return accounting


def _log_metrics(values: dict[str, float], step: int | None = None) -> None:
    if tracking.enabled() and os.environ.get("MLFLOW_RUN_ID"):
        import mlflow

        with mlflow.start_run(run_id=os.environ["MLFLOW_RUN_ID"]):
            mlflow.log_metrics({k: float(v) for k, v in values.items()}, step=step)


def train_task(
    dataset: str,
    recipe: str,
    overrides: str,
    issue: str,
    algorithm: str,
    tiny: bool,
    checkpoint_uri: str,
    checkpoint_key: str,
    parent: str,
    out: str,
) -> dict:
    """Train one issue's model into `out`; returns the last logged training metrics.

    Checkpoints go to ``checkpoint_uri/checkpoint_key/algorithm/issue`` and the task resumes
    from the newest one there: with the KFP run id as key, a retried pod continues its own
    run and a rerun from the UI (a new run id) starts fresh; a key the user names resumes
    that run on purpose.
    """
    from grail.tiny import build_tiny_model
    from grail.train import train

    recipe_path = resolve_recipe(recipe, issue, algorithm)
    args = [
        "--config",
        str(recipe_path),
        "--dataset",
        dataset,
        "--issues",
        issue,
        "--output_dir",
        out,
        "--gail_use",
        json.dumps(algorithm == "grail"),
    ]
    if checkpoint_uri:
        args += [
            "--checkpoint_uri",
            checkpoint_location(checkpoint_uri, checkpoint_key, algorithm, issue),
            "--resume_from_checkpoint",
            "latest",
        ]
    with tempfile.TemporaryDirectory(prefix="grail-tiny-") as tmp:
        if tiny:  # the embedded default: offline tiny models built from this dataset
            args += [
                "--model_name_or_path",
                str(build_tiny_model(Path(tmp) / "policy", data=dataset, format_warmup=100)),
            ]
            if algorithm == "grail":
                args += [
                    "--gail_model",
                    str(
                        build_tiny_model(
                            Path(tmp) / "discriminator", data=dataset, task="classifier"
                        )
                    ),
                ]
        args += overrides_to_args(overrides)
        params = {"recipe": recipe_path.name, "issue": issue, "algorithm": algorithm}
        with tracking.stage_run(parent, f"train:{issue}", params) as run_id:
            # The same entry point as `grail train`: several processes when the pod has
            # several GPUs (accelerate + ZeRO-3), each reporting to this stage's run.
            train([*args, "--report_to", "mlflow"] if run_id else args)
            if run_id:
                log_model(run_id, Path(out))
    rows = json.loads((Path(out) / "metrics.json").read_text())
    last = rows[-1] if rows else {}
    return {
        k: float(v)
        for k, v in last.items()
        if isinstance(v, int | float) and k in ("loss", "reward", "kl", "step")
    }


def checkpoint_location(uri: str, key: str, algorithm: str, issue: str) -> str:
    """Where one run's checkpoints of one algorithm and issue live.

    >>> checkpoint_location("s3://b/ckpt/", "run-1", "grail", "gun_control")
    's3://b/ckpt/run-1/grail/gun_control'
    """
    key = key.strip().strip("/")
    if not key or "/" in key or key in (".", ".."):
        raise GrailError(f"checkpoint key {key!r}: give a run id or a name without '/'")
    return f"{uri.rstrip('/')}/{key}/{algorithm}/{issue}"


def log_model(run_id: str, folder: Path) -> None:
    """The final model's files (not the checkpoints) as the stage run's ``model`` artifacts."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        if path.name != "training_args.bin":
            client.log_artifact(run_id, str(path), artifact_path="model")


def benchmark_task(
    dataset: str,
    model: str,
    issue: str,
    algorithm: str,
    references: str,
    limit: int,
    max_new_tokens: int,
    parent: str,
    out: str,
) -> dict:
    """Benchmark one issue's model (every checkpoint) plus the reference models."""
    from grail.benchmark import run

    specs = json.loads(references or "[]")
    with tempfile.TemporaryDirectory(prefix="grail-bench-") as tmp:
        named = Path(tmp) / f"{algorithm}-{ISSUE_KEYS.get(issue, issue)}"
        named.symlink_to(Path(model).resolve(), target_is_directory=True)
        with tracking.stage_run(
            parent, f"benchmark:{issue}", {"issue": issue, "references": references}
        ):
            filtered = Path(tmp) / "data"
            _issue_subset(Path(dataset), issue, filtered)
            result = run(
                filtered,
                out,
                label=f"{issue} of {dataset}",
                models=[str(named), *specs],
                limit=limit or None,
                max_new_tokens=max_new_tokens or None,  # 0: as the model was trained
            )
    return {name.replace("@", "_at_"): s["accuracy"] for name, s in result["systems"].items()}


def _issue_subset(dataset: Path, issue: str, out: Path) -> None:
    """The cleaned dataset restricted to one issue (truth files kept for the ceiling)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from grail.outputs import mark_complete

    out.mkdir(parents=True)
    for path in dataset.glob("*.parquet"):
        table = pq.read_table(path)
        pq.write_table(table.filter(pc.equal(table["issue"], issue)), out / path.name)
    for name in ("truth.json", "truth_steps.csv"):
        if (dataset / name).is_file():
            shutil.copyfile(dataset / name, out / name)
    mark_complete(out, f"the {issue} part of a clean output")


def export_task(
    model: str, results: str, destination: str, issue: str, parent: str, out: str
) -> dict:
    """Export one issue's model and benchmark to ``destination/issue``; manifest to `out`."""
    from grail.export import export

    with tracking.stage_run(parent, f"export:{issue}", {"destination": destination}) as run_id:
        exported = export(
            model,
            results,
            f"{destination.rstrip('/')}/{issue}",
            run_ids={"pipeline": parent, "export": run_id or ""},
        )
    Path(out).write_text(json.dumps(exported["manifest"], indent=1))
    return {name: len(exported[name]) for name in ("uploaded", "skipped", "deleted")}


def generate_task(
    dataset: str, model: str, num_generations: int, limit: int, parent: str, out: str
) -> dict:
    from grail.generate import run

    with tracking.stage_run(parent, "generate", {"model": model}):
        summary = run(dataset, out, model, num_generations=num_generations, limit=limit or None)
        _log_metrics({k: summary[k] for k in ("generated", "failures", "acceptance_rate")})
    return summary


def finish(experiment: str, kfp_run_id: str) -> None:
    tracking.finish_pipeline_run(experiment, kfp_run_id)
