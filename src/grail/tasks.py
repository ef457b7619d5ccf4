"""What each pipeline task does: one call per KFP component, the stage plus its MLflow run.

The components in ``components/`` are adapters: typed parameters and artifact paths in, one call
to a function here, metrics out. These functions hold the little glue a pipeline task needs
beyond the stage itself (resolving the recipe, the per-issue filter, tracking).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path

from grail import tracking
from grail.config import home_folders
from grail.errors import GrailError, report_task_failure
from grail.issues import short_name
from grail.progress import show_progress
from grail.run_story import best_baseline_tag, register_export


def reported(task: str):
    """A task body that, when it fails, first prints the one line a runner shows
    (:func:`grail.errors.report_task_failure`: `task`, its issue and algorithm, the error),
    then fails as before (the traceback stays in the task's log)."""

    def wrap(body):
        signature = inspect.signature(body)

        @functools.wraps(body)
        def run(*args, **kwargs):
            try:
                return body(*args, **kwargs)
            except Exception as error:
                given = signature.bind_partial(*args, **kwargs).arguments
                where = {k: str(given.get(k) or "") for k in ("issue", "algorithm")}
                report_task_failure(task, error, **where)
                raise

        return run

    return wrap


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


ALGORITHMS = ("grpo", "grail")


def branches(issues: list[str], algorithms: list[str]) -> list[dict[str, str]]:
    """What a run trains: every issue with every algorithm (issue-major order).

    >>> branches(["gun_control"], ["grpo", "grail"])
    [{'issue': 'gun_control', 'algorithm': 'grpo'}, {'issue': 'gun_control', 'algorithm': 'grail'}]
    """
    unknown = [a for a in algorithms if a not in ALGORITHMS]
    if unknown or not algorithms or len(set(algorithms)) != len(algorithms):
        raise GrailError(
            f"algorithms: expected a list of distinct names from {', '.join(ALGORITHMS)}, "
            f"got {algorithms!r}"
        )
    if not issues:
        raise GrailError("issues: expected at least one issue")
    return [{"issue": i, "algorithm": a} for i in issues for a in algorithms]


def run_params(recipe: str, overrides: str, issues: list[str], algorithms: list[str], tiny: bool):
    """The parent run's params: the recipe resolved per issue and algorithm (fields equal for
    every branch once, the others as ``ISSUE.ALGORITHM.FIELD``), algorithms, issues and base
    model."""
    resolved = {
        f"{branch['issue']}.{branch['algorithm']}": recipe_values(
            resolve_recipe(recipe, branch["issue"], branch["algorithm"]), overrides, tiny
        )
        for branch in branches(issues, algorithms)
    }
    first = next(iter(resolved.values()))
    params = {
        key: value
        for key, value in first.items()
        if all(r.get(key) == value for r in resolved.values())
    }
    for branch, values in resolved.items():
        params |= {f"{branch}.{k}": v for k, v in values.items() if k not in params}
    params |= {
        "recipe": recipe,
        "algorithms": ",".join(algorithms),
        "issues": ",".join(issues),
        "base_model": base_model(first, tiny),
    }
    if overrides and json.loads(overrides):
        params["recipe_overrides"] = overrides
    return params


@reported("start-tracking")
def start(
    experiment: str,
    recipe: str,
    kfp_run_id: str,
    image: str,
    algorithms: list[str],
    issues: list[str],
    tiny: bool,
    overrides: str,
) -> str:
    """The pipeline's parent MLflow run ("" when tracking is off or KFP's plugin tracks)."""
    branches(issues, algorithms)  # a wrong list fails here, before anything runs
    if not tracking.enabled():
        return ""
    # where the tasks ran: a local runner (grail run --local sets GRAIL_RUNNER), else the image
    runner = os.environ.get("GRAIL_RUNNER")
    params = run_params(recipe, overrides, issues, algorithms, tiny)
    params |= {"runner": runner} if runner else {"image": image}
    together = "+".join(algorithms)
    return tracking.start_pipeline_run(
        experiment,
        tracking.run_name(recipe, together, kfp_run_id),
        params,
        {"kfp_run_id": kfp_run_id, "algorithms": together},
    )


@reported("clean")
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


@reported("train")
def train_task(
    dataset: str,
    recipe: str,
    overrides: str,
    issue: str,
    algorithm: str,
    base_models: str,
    checkpoint_uri: str,
    checkpoint_key: str,
    parent: str,
    out: str,
    runner=None,
) -> dict:
    """Train one issue's model into `out`; returns the last logged training metrics.

    `runner` trains elsewhere with the same ``grail train`` arguments (the TrainJob runner of
    ``train_backend=trainjob``); by default training runs in this pod.

    `base_models`: a :func:`tiny_models_task` folder (the embedded default's tiny policy and
    discriminator replace the recipe's models), or "" for the recipe's own.

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
    tiny = bool(base_models)
    if tiny:  # the embedded default: offline tiny models built from this dataset
        args += tiny_model_args(Path(base_models), algorithm)
    args += overrides_to_args(overrides)
    values = recipe_values(recipe_path, overrides, tiny)
    params = values | {
        "recipe": recipe_path.name,
        "issue": issue,
        "algorithm": algorithm,
        "base_model": base_model(values, tiny),
    }
    runner = runner or train
    with tracking.stage_run(parent, f"train:{issue}:{algorithm}", params) as run_id:
        # The same entry point as `grail train`: several processes when the pod has
        # several GPUs (accelerate + ZeRO-3), each reporting to this stage's run.
        if run_id:
            with tracking.trainer_params_off():
                runner([*args, "--report_to", "mlflow"])
            log_training(run_id, Path(out), Path(dataset), issue, algorithm)
        else:
            runner(args)
    rows = json.loads((Path(out) / "metrics.json").read_text())
    last = rows[-1] if rows else {}
    return {
        k: float(v)
        for k, v in last.items()
        if isinstance(v, int | float) and k in ("loss", "reward", "kl", "step")
    }


def log_training(run_id: str, out: Path, dataset: Path, issue: str, algorithm: str) -> None:
    """What a finished training leaves in its stage run: the dataset inputs, and the run's
    summary and metric rows. Not the model: the export task registers the exported one by
    reference (:func:`grail.run_story.register_export`), so MLflow holds no copy of it."""
    log_datasets(run_id, dataset, issue)
    tracking.log_artifacts(run_id, [out / n for n in ("summary.json", "metrics.json")], "train")


TINY_WARMUP = 100  # format warm-up steps of the embedded default's tiny policy


@reported("tiny-models")
def tiny_models_task(dataset: str, tiny: bool, out: str) -> None:
    """The embedded default's starting models, built once per run from the dataset: the tiny
    policy (``out/policy``) and discriminator (``out/discriminator``); nothing without `tiny`."""
    import torch

    from grail.tiny import build_tiny_model

    show_progress()
    Path(out).mkdir(parents=True, exist_ok=True)
    # No other task runs beside this one (the branches wait for its models): every core, not
    # the one thread per process that parallel local branches are given.
    torch.set_num_threads(os.cpu_count() or 1)
    if tiny:
        build_tiny_model(Path(out) / "policy", data=dataset, format_warmup=TINY_WARMUP)
        build_tiny_model(Path(out) / "discriminator", data=dataset, task="classifier")


def tiny_model_args(folder: Path, algorithm: str) -> list[str]:
    """The tiny policy (and discriminator for GRAIL) of a :func:`tiny_models_task` folder."""
    args = ["--model_name_or_path", str(folder / "policy")]
    if algorithm == "grail":
        args += ["--gail_model", str(folder / "discriminator")]
    return args


def checkpoint_location(uri: str, key: str, algorithm: str, issue: str) -> str:
    """Where one run's checkpoints of one algorithm and issue live.

    >>> checkpoint_location("s3://b/ckpt/", "run-1", "grail", "gun_control")
    's3://b/ckpt/run-1/grail/gun_control'
    """
    return run_folder(uri, key, "checkpoint key", algorithm, issue)


def run_folder(root: str, run: str, what: str, algorithm: str, issue: str) -> str:
    """``root/RUN/ALGORITHM/ISSUE``: one run's place for one branch (`what` names the run
    part in the error when it is empty or not one folder name)."""
    run = run.strip().strip("/")
    if not run or "/" in run or run in (".", ".."):
        raise GrailError(f"{what} {run!r}: give a run id or a name without '/'")
    return f"{root.rstrip('/')}/{run}/{algorithm}/{issue}"


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


@reported("benchmark")
def benchmark_task(
    dataset: str,
    model: str,
    base_models: str,
    issue: str,
    algorithm: str,
    references: str,
    limit: int,
    max_new_tokens: int,
    parent: str,
    out: str,
) -> dict:
    """Benchmark one issue's model (its starting model as step 0, every checkpoint) plus the
    reference models; returns the final systems' metrics under their stable names
    (``trained/accuracy``, ``baseline/ranker/log_loss``, ...) and logs the headline to the
    pipeline's parent run as ``ISSUE/ALGORITHM/FIELD``; a collapsed model is tagged there."""
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
                start_model=str(Path(base_models) / "policy") if base_models else None,
                branch={"issue": issue, "algorithm": algorithm},
            )
    summary = headline(result, trained)
    pipeline_run = tracking.pipeline_parent(parent)
    tracking.log_metrics(
        pipeline_run,
        {  # rounded: the runs table shows what was logged (0.4000000000000001)
            f"{issue}/{algorithm}/{k}": round(v, 4)
            for k, v in summary.items()
            if isinstance(v, int | float)
        },
    )
    named = {best_baseline_tag(issue, algorithm): summary.get("best_baseline")}
    if summary.get("collapsed"):
        named[f"collapsed.{issue}.{algorithm}"] = summary["collapsed"]
    tracking.set_tags(pipeline_run, {k: v for k, v in named.items() if v})
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


def export_location(destination: str, run: str, algorithm: str, issue: str) -> str:
    """Where one branch of one run is exported: no run or algorithm replaces another's.

    >>> export_location("s3://b/exports/", "run-7", "grpo", "gun_control")
    's3://b/exports/run-7/grpo/gun_control'
    """
    return run_folder(destination, run, "run name", algorithm, issue)


@reported("export")
def export_task(
    model: str,
    results: str,
    destination: str,
    run: str,
    issue: str,
    algorithm: str,
    parent: str,
    out: str,
) -> dict:
    """Export one branch's model and benchmark to ``destination/RUN/ALGORITHM/ISSUE``
    (:func:`export_location`); manifest to `out`. When tracking, the destination is an MLflow
    model registered by reference as a new version of the branch's registered model, described
    by the benchmark's headline (`results`)."""
    from grail.benchmark import headline
    from grail.export import export

    where = export_location(destination, run, algorithm, issue)
    params = {"destination": where, "issue": issue, "algorithm": algorithm}
    with tracking.stage_run(parent, f"export:{issue}:{algorithm}", params) as run_id:
        exported = export(
            model,
            results,
            where,
            run_ids={"pipeline": parent, "export": run_id or ""},
            mlflow_model=bool(run_id),
        )
        Path(out).write_text(json.dumps(exported["manifest"], indent=1))
        with tempfile.TemporaryDirectory() as tmp:  # under its own name in MLflow
            named = shutil.copyfile(out, Path(tmp) / "manifest.json")
            tracking.log_artifacts(run_id, [named], "export")
        tracking.log_metrics(
            run_id, {f"files_{name}": len(exported[name]) for name in ("uploaded", "skipped")}
        )
        if run_id:
            benchmark = json.loads((Path(results) / "metrics.json").read_text())
            summary = headline(benchmark, benchmark["trained"])
            register_export(run_id, issue, algorithm, where, summary)
    return {name: len(exported[name]) for name in ("uploaded", "skipped", "deleted")}


@reported("generate")
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


@reported("compare")
def compare_task(results: list[str], parent: str, out_json: str, out_markdown: str) -> dict:
    """The algorithms of this run compared per issue (:mod:`grail.compare`): the comparison
    and its report to the given paths and to the parent MLflow run; returns the differences."""
    from grail.compare import compare, headline, markdown

    comparison = compare([Path(r) for r in results])
    Path(out_json).write_text(json.dumps(comparison, indent=1) + "\n")
    Path(out_markdown).write_text(markdown(comparison))
    values = headline(comparison)
    pipeline_run = tracking.pipeline_parent(parent)
    tracking.log_metrics(pipeline_run, values)
    with tempfile.TemporaryDirectory() as tmp:  # under their own names in MLflow
        named = [
            shutil.copyfile(out_json, Path(tmp) / "comparison.json"),
            shutil.copyfile(out_markdown, Path(tmp) / "comparison.md"),
        ]
        tracking.log_artifacts(pipeline_run, named, "compare")
    return values


@reported("finish-tracking")
def finish(experiment: str, kfp_run_id: str) -> None:
    tracking.finish_pipeline_run(experiment, kfp_run_id)
