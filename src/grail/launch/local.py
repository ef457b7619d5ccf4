"""``grail run --local [--recipe R] [--participants N]``: the whole DAG on this machine with
``kfp.local`` (``SubprocessRunner(use_venv=False)``, or ``DockerRunner`` in the local image):
synthetic study, tiny offline models, MLflow in a local sqlite store (or
``MLFLOW_TRACKING_URI``), export to a local folder unless an S3 destination is given. No
network, GPU or Kubernetes. Recipes are found as :func:`grail.core.recipes.find_recipe` says.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grail.core import tracking
from grail.core.config import option
from grail.core.errors import GrailError
from grail.core.storage import check_run_name, check_uri
from grail.core.tracking import environment_variable
from grail.launch.compile import task_pipeline
from grail.launch.kfp_local import local_image_for_every_task, local_run_identity
from grail.launch.terminal import TaskLines, branch_rows, mlflow_pointer
from grail.tasks import DEFAULT_TASK, TASKS, Task


def local_arguments(config: RunConfig, destination: str, run: str) -> dict:
    """Pipeline arguments of the embedded default (tiny models, a synthetic study unless
    ``--raw`` names an export); `run` names the run's export folder."""
    config = task_defaults(config)
    shared = {
        "raw_uri": config.raw or "",
        "recipe": config.recipe,
        "algorithms": config.algorithms,
        "tiny_model": True,
        "recipe_overrides": json.dumps(
            {"max_steps": config.max_steps, "save_steps": max(1, config.max_steps // 2)}
            if config.max_steps
            else {}  # the recipe's own steps and saves (the summarize task's default)
        ),
        "benchmark_limit": config.benchmark_limit,
        "benchmark_reads_rows": config.benchmark_reads_rows,
        "checkpoint_uri": "",
        "export_destination": destination,
        "promote_if": config.promote_if,
        "run_name": run,
    }
    task = TASKS[config.task]
    return (
        shared
        | task.embedded_arguments(config)
        | {"mlflow_experiment": task.embedded["mlflow_experiment"]}
    )


def local_run_id(config: RunConfig) -> str:
    """A local run's id: ``--run-name``, else the time it started (``20261123-195526``).

    kfp.local would make a random number the run id and ``grail-TIME`` its folder, so neither
    the MLflow runs nor the exports could be matched to the folder: :func:`local_run_identity`
    gives the run this id and the folder ``grail-ALGORITHMS-ID``.
    """
    return config.run_name or time.strftime("%Y%m%d-%H%M%S")


def local_folder_name(run: str, algorithms: list[str], task: str = DEFAULT_TASK) -> str:
    """The pipeline-root folder of a local run (the task's ``embedded`` folder part).

    >>> local_folder_name("20261123-195526", ["grpo", "grail"])
    'grail-grpo+grail-20261123-195526'
    >>> local_folder_name("20261123-195526", ["grpo"], "summarize")
    'grail-summarize-grpo-20261123-195526'
    """
    return f"grail-{TASKS[task].embedded['folder']}{'+'.join(algorithms)}-{run}"


def failed_run(lines: TaskLines) -> GrailError:
    """The error a failed local run ends with: the failing task's own line (task, issue and
    algorithm, message; :func:`grail.core.errors.task_failures`), the log's path; exit 2 when the
    input is wrong, 1 otherwise."""
    from grail.core.errors import task_failures

    reported = task_failures(lines.log.read_text(errors="replace"))
    messages, kinds = [], set()
    for task in (r for r in lines.finished if r["status"] != "SUCCESS"):
        mine = [
            f
            for f in reported
            if f["task"] == task["task"]
            and f"{f.get('issue', '')} {f.get('algorithm', '')}".strip() == task["branch"]
        ]
        name = f"{task['task']} ({task['branch']})" if task["branch"] else task["task"]
        if mine:
            messages.append(f"{name} failed: {mine[-1]['message']}")
            kinds.add(mine[-1]["kind"])
        else:
            messages.append(f"{name} failed without an error of its own (killed, out of memory?)")
            kinds.add("bug")
    if not messages:
        messages, kinds = ["the pipeline failed before any task ran"], {"bug"}
    more = f" (and {len(messages) - 1} more: {'; '.join(messages[1:])})" if messages[1:] else ""
    error = GrailError(f"{messages[0]}{more}; log: {lines.log}")
    error.exit_code = 2 if kinds == {"input"} else 1
    return error


LOCAL_IMAGE = "localhost/grail:dev"  # what `make images-local` builds


@dataclass(kw_only=True)
class RunConfig:
    """grail run --local: the whole pipeline on this machine with kfp.local (synthetic study,
    tiny offline models, local MLflow)."""

    local: bool = option("Run on this machine (kfp.local).", False)
    task: Task = option(
        "slate: the GRAIL slate DAG (pipelines/grail.yaml); summarize: the document "
        "summarizer's DAG (pipelines/summarize.yaml) on a synthetic document study.",
        "slate",
    )
    recipe: str | None = option(
        "Training recipe ({algorithm} and {issue} are filled in; default: "
        "recipes/tiny/config_{algorithm}.yaml, with --task summarize "
        "recipes/tiny/config_summarize.yaml).",
        None,
    )
    algorithms: list[str] | None = option(
        "Algorithms trained on each issue and compared: grpo, grail (GRPO plus the GAIL "
        "reward), bc (behaviour cloning: SFT on the train split's own choices); repeatable "
        "(default: grpo and grail; with --task summarize grpo).",
        None,
        aliases=["--algorithm"],
        action="extend",
        metavar="ALGORITHM",
    )
    issues: list[str] = option(
        "Issues trained, each with every algorithm: gun_control, minimum_wage; repeatable. "
        "One issue halves the branches (and the time) of a run (default: every issue).",
        [],
        aliases=["--issue"],
        action="extend",
        metavar="ISSUE",
    )
    run_name: str | None = option(
        "This run's id: its exports' folder under the destination, its MLflow kfp_run_id "
        "(default: the time it started).",
        None,
    )
    raw: str | None = option(
        "The study's raw export (a folder, file:// or s3://) instead of a synthetic study.", None
    )
    participants: int = option("Size of the synthetic study.", 1500)
    documents: int = option("Task summarize: documents of the synthetic study.", 300)
    validation_documents: int = option(
        "Task summarize: documents held out for validation (Summary-RL's 91).", 91
    )
    validation_fraction: float = option(
        "Share of participants held out for validation. The demo trains on a few hundred rows "
        "and holds out 0.4 (about 600 rows per issue): the change in log-loss that training "
        "buys the tiny model, a few hundredths of a nat, needs that many for a paired interval "
        "to resolve it (on gun control's 152 rows at 0.1 it cannot).",
        0.4,
    )
    max_steps: int | None = option(
        "Training steps per issue (default: 4; with --task summarize the recipe's).", None
    )
    benchmark_limit: int = option("Validation rows benchmarked per issue (0 = all).", 600)
    benchmark_reads_rows: int = option(
        "The first N benchmarked rows each model and the ranker answer again with the "
        "viewer's lines, then the options, swapped: whether it reads (0: none).",
        200,
    )
    counterfactual_viewers: int = option(
        "Validation participants per issue whose counterfactual sessions each branch rolls out "
        "(docs/counterfactual.md); 0 skips the task, as make demo does (make "
        "demo-counterfactual: 40).",
        0,
    )
    outputs: str = option(
        "Folder for the pipeline root, the MLflow store and the export.", "local_outputs"
    )
    export_destination: str | None = option("s3://bucket/prefix; unset: OUTPUTS/export.", None)
    promote_if: Literal["beats_prior", "always", "never"] = option(
        "The promotion gate's rule (the pipeline's promote_if): beats_prior promotes a model "
        "that beats the position prior (slate) or the best baseline (summarize) by its "
        "interval; every model is exported either way.",
        "beats_prior",
    )
    runner: Literal["subprocess", "docker"] = option(
        "kfp.local runner: this Python environment, or containers through DOCKER_HOST.",
        "subprocess",
    )
    image: str = option(
        "With --runner docker: the image every task runs in (make images-local).", LOCAL_IMAGE
    )


def run_local(config: RunConfig | None = None, terminal=None) -> dict:
    """Run the whole DAG with kfp.local; returns where the outputs are.

    ``runner="subprocess"`` runs each task in this Python environment; ``runner="docker"`` runs
    each in `image` (both the CPU tasks and training: the CUDA image is too large to build on a
    laptop) through a Docker API (:func:`grail.launch.engine.docker_api`: ``DOCKER_HOST``, Docker's
    socket, or a podman service started for the run), as the image's non-root user, with the
    same ``--outputs`` folder mounted at the same path.
    """
    config = task_defaults(config or RunConfig())
    if config.runner not in ("subprocess", "docker"):
        raise GrailError(f"--runner {config.runner!r}: choose subprocess or docker")
    TASKS[config.task].embedded_arguments(config)  # the task's own settings, checked first
    if config.run_name is not None:  # it names the run's folder: never a path out of it
        config.run_name = check_run_name(config.run_name, "--run-name")
    if config.export_destination:
        check_uri(config.export_destination)
    if config.runner == "docker":
        from grail.launch.engine import docker_api

        with docker_api(config.image) as host, environment_variable("DOCKER_HOST", host):
            return _run_local(config, terminal)
    return _run_local(config, terminal)


def task_defaults(config: RunConfig) -> RunConfig:
    """The settings left unset, as the task's embedded default has them."""
    from dataclasses import replace

    task = TASKS[config.task]
    defaults = task.embedded
    return replace(
        config,
        recipe=config.recipe or defaults["recipe"],
        algorithms=config.algorithms or defaults["algorithms"],
        max_steps=config.max_steps or defaults["max_steps"],
        issues=task.branch_subjects(config.issues),
    )


def threads_per_branch(config: RunConfig, cores: int | None = None) -> str:
    """The cores each branch's tasks may use: the branches run side by side and share them
    (the demo's two on 2 cores: one each; the summarize task's one branch: all).

    >>> threads_per_branch(RunConfig(issues=["gun_control"], algorithms=["grpo", "grail"]), 2)
    '1'
    >>> threads_per_branch(RunConfig(issues=["documents"], algorithms=["grpo"]), 2)
    '2'
    """
    branches = len(config.issues) * len(config.algorithms or ["grpo", "grail"])
    return str(max(1, (cores or os.cpu_count() or 1) // branches))


def check_run_outputs(outputs: Path) -> None:
    """``--outputs`` holds local runs, one beside the other: a folder of its own (not a link,
    not inside an export), empty or one where an earlier run wrote (its ``pipeline.log``); a
    folder of someone's files is refused in one line (a run appends its log and writes its
    MLflow store and pipeline root there)."""
    from grail.core.outputs import check_outside_exports, check_own_folder

    check_own_folder(outputs, here=False)
    check_outside_exports(outputs)
    if outputs.is_dir() and any(outputs.iterdir()) and not (outputs / RUN_LOG).is_file():
        raise GrailError(
            f"--outputs {outputs}: holds files and no {RUN_LOG} of an earlier grail run; "
            "name an empty folder or one grail run used"
        )


# glibc's malloc for the task processes (mallopt(3)'s environment variables): by default each
# step's large tensors are mmap'ed and returned to the kernel when freed, and its next step
# faults the same pages in again; a fixed mmap threshold (32 MiB, the cap of glibc's dynamic
# one on 64-bit), a heap that keeps up to 1 GiB of freed memory and grows 256 MiB at a time
# reuse them instead. Measured (docs/development.md#the-demo): the tiny cloning's 39 steps in
# 33-38 s against 40-45 s, the demo's tiny-models task 56 s against 63 s.
MALLOC = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
    "MALLOC_TOP_PAD_": str(256 << 20),
}

RUN_LOG = "pipeline.log"  # every local run appends to it: the folder's mark of grail's runs


def _run_local(config: RunConfig, terminal) -> dict:
    from kfp import local

    outputs = Path(config.outputs).absolute()
    check_run_outputs(outputs)
    outputs.mkdir(parents=True, exist_ok=True)
    destination = config.export_destination or str(outputs / "export")
    run = local_run_id(config)
    runner = f"kfp.local {config.runner}" + (
        f" {config.image}" if config.runner == "docker" else ""
    )
    environment = {
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # parallel branches share the machine's cores
        "OMP_NUM_THREADS": threads_per_branch(config),
        "MKL_NUM_THREADS": threads_per_branch(config),
        "GRAIL_RUNNER": runner,  # what MLflow records instead of the cluster's image
    } | MALLOC
    if not tracking.enabled():  # a local store, its artifacts beside it
        environment["MLFLOW_TRACKING_URI"] = f"sqlite:///{outputs / 'mlflow.db'}"
        environment["GRAIL_MLFLOW_ARTIFACTS"] = (outputs / "mlflow-artifacts").as_uri()
    for name, value in environment.items():
        os.environ[name] = value if name == "GRAIL_RUNNER" else os.environ.get(name, value)
    arguments = local_arguments(config, destination, run)
    if config.runner == "docker":
        root = outputs  # DockerRunner mounts only the pipeline root, at the same path
        # The tasks run as the image's uid 10001, the folders kfp.local makes as this user:
        # everything under --outputs is made writable for both.
        os.umask(0)
        outputs.chmod(0o777)
        arguments |= {"image": config.image, "train_image": config.image}
        task_runner = local.DockerRunner(
            environment={name: os.environ[name] for name in environment}
        )
    else:
        root = outputs / "pipeline_root"
        task_runner = local.SubprocessRunner(use_venv=False)
    local.init(runner=task_runner, pipeline_root=str(root))
    folder = local_folder_name(run, config.algorithms, config.task)
    try:  # made here, at once: of two runs given one name, exactly one goes on
        (root / folder).mkdir(parents=True)
    except FileExistsError:
        raise GrailError(f"{root / folder} exists: give this run another --run-name") from None
    started = time.time()
    lines = TaskLines(terminal or sys.stdout, outputs / RUN_LOG)
    lines.say(f"running the pipeline locally: run {run}, folder {root / folder}")
    lines.say(f"task logs in {lines.log}")
    try:
        with (
            lines.attached(),
            local_run_identity(run, folder),
            local_image_for_every_task(config.image)
            if config.runner == "docker"
            else nullcontext(),
        ):
            task_pipeline(config.task)(**arguments)
    except RuntimeError:  # kfp.local: "Pipeline 'grail' finished with status FAILURE ..."
        raise failed_run(lines) from None
    compared = next(iter(lines.outputs("compare").values()), {})
    return {
        "run": run,
        "folder": str(root / folder),
        "algorithms": config.algorithms,
        "branches": branch_rows(lines.outputs("benchmark"), lines.outputs("promote")),
        "comparison": json.loads(Path(compared["comparison"]).read_text()) if compared else None,
        "comparison_report": compared.get("report"),
        "models": {b: p["model"] for b, p in lines.outputs("train").items()},
        "counterfactual": {
            b: str(Path(p["outcomes"]) / "report.md")
            for b, p in lines.outputs("counterfactual").items()
        },
        "export": arguments["export_destination"],
        "mlflow": mlflow_pointer(os.environ["MLFLOW_TRACKING_URI"], arguments["mlflow_experiment"]),
        "log": str(lines.log),
        "seconds": round(time.time() - started, 1),
    }
