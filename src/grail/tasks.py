"""What each pipeline task does: one call per KFP component, the stage plus its MLflow run.

The components in ``components/`` are adapters: typed parameters and artifact paths in, one call
to a function here, metrics out. These functions hold the little glue a pipeline task needs
beyond the stage itself (resolving the recipe, the per-issue filter, tracking).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from grail import tracking
from grail.config import home_folders
from grail.errors import GrailError
from grail.issues import short_name
from grail.progress import show_progress


def resolve_recipe(recipe: str, issue: str, algorithm: str) -> Path:
    """A recipe path, with ``{issue}`` (gun/wage) and ``{algorithm}`` filled in, found relative
    to the working directory or ``GRAIL_HOME`` (the image's checkout)."""
    name = recipe.format(issue=short_name(issue), algorithm=algorithm)
    for root in home_folders():
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


# Recipe fields that are places on one machine, not settings: never params (a temp path means
# nothing in a comparison); the datasets are MLflow dataset inputs instead.
PLACE_FIELDS = ("output_dir", "dataset", "logging_dir", "checkpoint_uri", "sft_dataset")
TINY = "tiny (offline, built from the dataset)"


def recipe_values(recipe_path: Path, overrides: str, tiny: bool) -> dict[str, str]:
    """A recipe as it will run (file + overrides), as MLflow params: settings, not places."""
    from grail.config import read_recipe

    values = read_recipe(recipe_path) | json.loads(overrides or "{}")
    skip = set(PLACE_FIELDS) | ({"model_name_or_path", "gail_model"} if tiny else set())
    return {
        key: json.dumps(value) if isinstance(value, list | dict) else str(value)
        for key, value in values.items()
        if key not in skip
    }


def base_model(values: dict[str, str], tiny: bool) -> str:
    return TINY if tiny else values.get("model_name_or_path", "unknown")


def run_params(recipe: str, overrides: str, issues: list[str], algorithm: str, tiny: bool):
    """The parent run's params: the recipe resolved per issue (fields equal for every issue
    once, the others as ``ISSUE.FIELD``), algorithm, issues and base model."""
    resolved = {
        issue: recipe_values(resolve_recipe(recipe, issue, algorithm), overrides, tiny)
        for issue in issues
    }
    first = resolved[issues[0]] if issues else {}
    params = {
        key: value
        for key, value in first.items()
        if all(r.get(key) == value for r in resolved.values())
    }
    for issue, values in resolved.items():
        params |= {f"{issue}.{k}": v for k, v in values.items() if k not in params}
    params |= {
        "recipe": recipe.format(issue="{issue}", algorithm=algorithm),
        "algorithm": algorithm,
        "issues": ",".join(issues),
        "base_model": base_model(first, tiny),
    }
    if overrides and json.loads(overrides):
        params["recipe_overrides"] = overrides
    return params


def start(
    experiment: str,
    recipe: str,
    kfp_run_id: str,
    image: str,
    algorithm: str,
    issues: list[str],
    tiny: bool,
    overrides: str,
) -> str:
    """The pipeline's parent MLflow run ("" when tracking is off or KFP's plugin tracks)."""
    if not tracking.enabled():
        return ""
    params = run_params(recipe, overrides, issues, algorithm, tiny) | {"image": image}
    return tracking.start_pipeline_run(
        experiment,
        tracking.run_name(recipe, algorithm, kfp_run_id),
        params,
        {"kfp_run_id": kfp_run_id, "algorithm": algorithm},
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
    with (
        tracking.stage_run(parent, "clean", params) as run_id,
        tempfile.TemporaryDirectory() as tmp,
    ):
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
        tracking.log_params(
            tracking.pipeline_parent(parent), {"dataset_fingerprint": fingerprint(Path(out))}
        )
        tracking.log_metrics(
            run_id, {k: accounting[k] for k in ("rows_kept", "rows_in", "participants_kept")}
        )
        tracking.log_artifacts(run_id, [Path(out) / "audit.md", Path(out) / "audit.json"], "audit")
    return accounting


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
    from grail.train import train

    show_progress()  # the tiny model's warm-up and training's own lines
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
            args += tiny_model_args(Path(tmp), dataset, algorithm)
        args += overrides_to_args(overrides)
        values = recipe_values(recipe_path, overrides, tiny)
        params = values | {
            "recipe": recipe_path.name,
            "issue": issue,
            "algorithm": algorithm,
            "base_model": base_model(values, tiny),
        }
        with tracking.stage_run(parent, f"train:{issue}:{algorithm}", params) as run_id:
            # The same entry point as `grail train`: several processes when the pod has
            # several GPUs (accelerate + ZeRO-3), each reporting to this stage's run.
            if run_id:
                with tracking.trainer_params_off():
                    train([*args, "--report_to", "mlflow"])
                log_training(run_id, Path(out), Path(dataset), issue, algorithm)
            else:
                train(args)
    rows = json.loads((Path(out) / "metrics.json").read_text())
    last = rows[-1] if rows else {}
    return {
        k: float(v)
        for k, v in last.items()
        if isinstance(v, int | float) and k in ("loss", "reward", "kl", "step")
    }


def log_training(run_id: str, out: Path, dataset: Path, issue: str, algorithm: str) -> None:
    """What a finished training leaves in its stage run: the registered model, the dataset
    inputs, and the run's summary and metric rows."""
    log_model(run_id, out, f"grail-{issue}-{algorithm}")
    log_datasets(run_id, dataset, issue)
    tracking.log_artifacts(run_id, [out / n for n in ("summary.json", "metrics.json")], "train")


def tiny_model_args(folder: Path, dataset: str, algorithm: str) -> list[str]:
    """The tiny policy (and discriminator for GRAIL), built offline from the dataset."""
    from grail.tiny import build_tiny_model

    policy = build_tiny_model(folder / "policy", data=dataset, format_warmup=100)
    args = ["--model_name_or_path", str(policy)]
    if algorithm == "grail":
        classifier = build_tiny_model(folder / "discriminator", data=dataset, task="classifier")
        args += ["--gail_model", str(classifier)]
    return args


def checkpoint_location(uri: str, key: str, algorithm: str, issue: str) -> str:
    """Where one run's checkpoints of one algorithm and issue live.

    >>> checkpoint_location("s3://b/ckpt/", "run-1", "grail", "gun_control")
    's3://b/ckpt/run-1/grail/gun_control'
    """
    key = key.strip().strip("/")
    if not key or "/" in key or key in (".", ".."):
        raise GrailError(f"checkpoint key {key!r}: give a run id or a name without '/'")
    return f"{uri.rstrip('/')}/{key}/{algorithm}/{issue}"


# The final model's files; checkpoints, trainer state and our own bookkeeping stay out.
MODEL_SKIP = ("training_args.bin", "_COMPLETE.json", "metrics.json", "summary.json")


def log_model(run_id: str, folder: Path, registered_name: str) -> None:
    """The final model with MLflow's transformers flavour (a text-generation pipeline that
    ``mlflow.transformers.load_model`` rebuilds), registered as a new version of
    `registered_name`, into the stage run `run_id`."""
    import importlib.metadata

    import mlflow

    with tempfile.TemporaryDirectory(prefix="grail-final-") as tmp:
        final = Path(tmp) / "model"
        final.mkdir()
        for path in folder.iterdir():
            if path.is_file() and path.name not in MODEL_SKIP:
                shutil.copyfile(path, final / path.name)
        # Given explicitly: MLflow's inference imports torchvision, which a training image lacks.
        requirements = [
            f"{name}=={importlib.metadata.version(name)}"
            for name in ("torch", "transformers", "accelerate")
        ]
        with mlflow.start_run(run_id=run_id):
            mlflow.transformers.log_model(
                transformers_model=str(final),
                name="model",
                task="text-generation",
                pip_requirements=requirements,
                registered_model_name=registered_name,
            )


def log_datasets(run_id: str, dataset: Path, issue: str) -> None:
    """The issue's train and validation rows as the run's MLflow dataset inputs."""
    import warnings

    import mlflow

    with mlflow.start_run(run_id=run_id), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MLflow's schema hints about integer columns
        for split, context in (("train", "training"), ("validation", "validation")):
            path = dataset / f"{split}.parquet"
            if not path.is_file():
                continue
            rows = issue_rows(path, issue).to_pandas()
            mlflow.log_input(
                mlflow.data.from_pandas(
                    rows, source=str(path), name=f"{issue}/{split}", targets="gold_index"
                ),
                context=context,
            )


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
    """Benchmark one issue's model (every checkpoint) plus the reference models; returns the
    final systems' metrics under their stable names (``trained/accuracy``, ``baseline/ranker/
    accuracy``, ...) and logs the headline to the pipeline's parent run as ``ISSUE/FIELD``."""
    from grail.benchmark import SUMMARY_FIELDS, headline, run, stable_metrics

    show_progress()  # the task's log shows a line per model and completions every 10 s
    specs = json.loads(references or "[]")
    trained = f"{algorithm}-{short_name(issue)}"
    params = {"issue": issue, "algorithm": algorithm, "limit": limit}
    params |= {"references": references} if specs else {}
    params |= {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
    with tempfile.TemporaryDirectory(prefix="grail-bench-") as tmp:
        named = Path(tmp) / trained
        named.symlink_to(Path(model).resolve(), target_is_directory=True)
        with tracking.stage_run(parent, f"benchmark:{issue}:{algorithm}", params):
            filtered = Path(tmp) / "data"
            _issue_subset(Path(dataset), issue, filtered)
            result = run(
                filtered,
                out,
                label=f"{issue} of {dataset}",
                models=[str(named), *specs],
                limit=limit or None,
                max_new_tokens=max_new_tokens or None,  # 0: as the model was trained
                trained=trained,
            )
    summary = headline(result, trained)
    tracking.log_metrics(
        tracking.pipeline_parent(parent),
        {f"{issue}/{k}": v for k, v in summary.items() if isinstance(v, int | float)},
    )
    return {
        key: value
        for key, value, _ in stable_metrics(result, trained)
        if key.endswith(tuple(f"/{f}" for f in SUMMARY_FIELDS)) and "_by_step" not in key
    }


def issue_rows(path: Path, issue: str):
    """One issue's rows of a parquet file in the contract (a pyarrow Table)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    return table.filter(pc.equal(table["issue"], issue))


def _issue_subset(dataset: Path, issue: str, out: Path) -> None:
    """The cleaned dataset restricted to one issue (truth files kept for the ceiling)."""
    import pyarrow.parquet as pq

    from grail.outputs import mark_complete

    out.mkdir(parents=True)
    for path in dataset.glob("*.parquet"):
        pq.write_table(issue_rows(path, issue), out / path.name)
    for name in ("truth.json", "truth_steps.csv"):
        if (dataset / name).is_file():
            shutil.copyfile(dataset / name, out / name)
    mark_complete(out, f"the {issue} part of a clean output")


def export_task(
    model: str,
    results: str,
    destination: str,
    issue: str,
    algorithm: str,
    parent: str,
    out: str,
) -> dict:
    """Export one issue's model and benchmark to ``destination/issue``; manifest to `out`."""
    from grail.export import export

    params = {"destination": destination, "issue": issue, "algorithm": algorithm}
    with tracking.stage_run(parent, f"export:{issue}:{algorithm}", params) as run_id:
        exported = export(
            model,
            results,
            f"{destination.rstrip('/')}/{issue}",
            run_ids={"pipeline": parent, "export": run_id or ""},
        )
        Path(out).write_text(json.dumps(exported["manifest"], indent=1))
        with tempfile.TemporaryDirectory() as tmp:  # under its own name in MLflow
            named = shutil.copyfile(out, Path(tmp) / "manifest.json")
            tracking.log_artifacts(run_id, [named], "export")
        tracking.log_metrics(
            run_id, {f"files_{name}": len(exported[name]) for name in ("uploaded", "skipped")}
        )
    return {name: len(exported[name]) for name in ("uploaded", "skipped", "deleted")}


def generate_task(
    dataset: str, model: str, num_generations: int, limit: int, parent: str, out: str
) -> dict:
    from grail.generate import run

    params = {"model": model, "num_generations": num_generations, "limit": limit}
    with tracking.stage_run(parent, "generate", params) as run_id:
        summary = run(dataset, out, model, num_generations=num_generations, limit=limit or None)
        tracking.log_metrics(
            run_id, {k: summary[k] for k in ("generated", "failures", "acceptance_rate")}
        )
    return summary


def finish(experiment: str, kfp_run_id: str) -> None:
    tracking.finish_pipeline_run(experiment, kfp_run_id)
