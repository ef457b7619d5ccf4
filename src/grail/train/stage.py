"""Stage ``train``: GRPO or GRAIL (GRPO + discriminator reward) with TRL's ``GRPOTrainer``.

Run: ``grail train --config recipes/tiny/config_grpo.yaml [--key value ...]``.

Load the cleaned dataset and build conversational prompts; resolve the reward functions (and the
discriminator for GRAIL); train; save the final model and ``metrics.json`` in ``output_dir``.
With ``sft_dataset`` (a ``grail generate`` output, or ``choices``: behaviour cloning on the train
split's own choices), TRL's ``SFTTrainer`` runs first and GRPO starts from its model
(``output_dir/sft``, with its own ``metrics.json``), benchmarked as the run's step 0.
Checkpoints go to ``checkpoint_uri`` after every save; ``--resume_from_checkpoint latest``
continues from the newest complete one. With ``MLFLOW_TRACKING_URI`` set, params and metrics go
to MLflow through transformers' own integration (into ``MLFLOW_RUN_ID`` when that is set).

The parts :func:`run` calls: the examples (:mod:`grail.train.examples`), the warm start
(:mod:`grail.train.sft`), the trainer (:mod:`grail.train.trainer`) and what the run leaves
(:mod:`grail.train.results`, :mod:`grail.train.logs`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from transformers import TrainerCallback

from grail.core import tracking
from grail.core.checkpoints import UPLOAD_STAGING
from grail.core.errors import GrailError, ProcessesFailed
from grail.core.lease import check_still_held
from grail.core.outputs import begin_write, end_write, mark_complete, one_writer, replace_text
from grail.train.config import ModelConfig, TrainConfig, parse_train_args
from grail.train.results import (
    cloned_result,
    copy_model_files,
    finished_step,
    not_written,
    start_step,
)
from grail.train.sft import sft_warm_start
from grail.train.trainer import build_trainer, discriminator_callback, discriminator_summary

logger = logging.getLogger("grail.train.stage")


def main(argv: list[str]) -> None:
    """``grail train`` entry point."""
    if argv == ["--help-all"]:
        argv = ["--help"]
    summary = train(argv)
    if "global_step" not in summary:
        print(f"node {summary['node']} trained its share; the run's summary is on node 0")
    else:
        print(
            f"trained {summary['global_step']} steps on {summary['world_size']} process(es) in "
            f"{summary['seconds']} s; model and metrics.json in {summary['output_dir']}"
        )
    end_launched_rank()


def end_launched_rank() -> None:
    """A rank that accelerate started ends here, its model saved and its group left: what it
    owes is flushed (MLflow's active run, logging, stdout) and the process exits 0 without
    the interpreter's teardown, whose C++ destructors of gloo/DeepSpeed threads still aborted
    a rank after training and saving ("terminate called without an active exception",
    SIGABRT: once in six rehearsal runs after :func:`leave_process_group`). Not a launched
    rank (a plain ``grail train``, the KFP task): returns."""
    from grail.train.multigpu import launched

    if not launched():
        return
    if "mlflow" in sys.modules:  # what MLflow's own exit handler does: end the run (its
        import mlflow  # async queue flushed); no store is made where no run is active

        if mlflow.active_run() is not None:
            mlflow.end_run()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train(argv: list[str]) -> dict:
    """The one training entry point (``grail train`` and the KFP train task): relaunches under
    accelerate when several processes are asked for (``num_processes``, or one per visible
    GPU), else trains here; returns the run summary (``output_dir/summary.json``)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    config, model_config = parse_train_args(argv)
    check_tiny_assets(config, model_config)
    check_checkpoint_place(config, model_config)
    with one_writer(config.output_dir, "training"), checkpoint_lease(config) as lease:
        if lease is not None:  # the lease's holder: make checkpoint_uri this run's
            from grail.core.checkpoints import claim_checkpoints

            claim_checkpoints(
                config.checkpoint_uri, config.resume_from_checkpoint is not None, config.fork_from
            )
        summary = _train(argv, config, model_config)
    leave_process_group()
    return summary


def _train(argv: list[str], config, model_config) -> dict:
    from grail.train.multigpu import Nodes, plan_for, relaunch

    plan = plan_for(argv, config, model_config)
    if plan:
        status = relaunch(plan)
        if status != 0:
            raise ProcessesFailed("training processes", status)
        summary = Path(config.output_dir) / "summary.json"
        if not summary.is_file():  # a TrainJob node other than 0: rank 0 wrote it, elsewhere
            return {"node": Nodes.from_environment().rank, "output_dir": config.output_dir}
        return json.loads(summary.read_text())
    adapt_to_environment(config, argv)
    return run(config, model_config)


def run(config: TrainConfig, model_config: ModelConfig) -> dict:
    """Train and save; returns a summary (also written as ``output_dir/summary.json``)."""
    from grail.core.checkpoints import upload_final
    from grail.train.checkpoint_upload import CheckpointUploadCallback

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    check_models(config, model_config)
    if config.upload_final and not config.checkpoint_uri:
        raise GrailError("upload_final: set checkpoint_uri, where the final model goes")
    claim_output_dir(config, model_config)
    resume = starting_checkpoint(config)
    sft_model, started = None, time.perf_counter()
    if config.sft_dataset and config.fork_from:
        logger.info("fork_from: no warm start in a fork (the parent made its own)")
    elif config.sft_dataset:  # a resumed run keeps the SFT model it already made
        done = Path(config.output_dir) / "sft" / "config.json"
        resumed = resume and done.is_file()
        sft_model = str(done.parent) if resumed else warm_start(config, model_config)
        if not config.rl:
            return cloned_result(config, model_config.model_name_or_path, sft_model, started)
        model_config.model_name_or_path = sft_model
    start_model = model_config.model_name_or_path  # step 0, benchmarked beside the checkpoints
    if Path(start_model).expanduser().exists():
        start_model = str(Path(start_model).expanduser().resolve())
    finished = finished_step(resume, config.max_steps)
    begun = start_step(resume)  # read now: save_total_limit may rotate that checkpoint away
    if finished is not None:  # nothing left to train: the checkpoint is the final model
        logger.info("%s already reached step %d: training 0 steps", resume, finished)
        model_config.model_name_or_path = resume
    trainer, metrics = build_trainer(config, model_config, resume)
    claims = ClaimCheckpoints()
    if trainer.is_world_process_zero():  # last: after every callback that writes a checkpoint
        trainer.add_callback(claims)
    discriminator = discriminator_callback(trainer)
    started = time.perf_counter()
    if finished is None:
        train_and_save(trainer, resume, start_model)
    else:  # no DeepSpeed engine without train(): the checkpoint's own model files
        if discriminator is not None:  # on_train_begin does not run: restore it here
            discriminator.on_train_begin(trainer.args, trainer.state, trainer.control)
        if trainer.is_world_process_zero():
            claims.strays = not_written(Path(config.output_dir))
            copy_model_files(Path(resume), Path(config.output_dir))
    step = finished if finished is not None else trainer.state.global_step
    summary = {
        "global_step": step,
        "steps_trained": step - (finished if finished is not None else begun),
        "resumed_from": resume,
        "forked_from": config.fork_from,
        "seconds": round(time.perf_counter() - started, 2),
        "world_size": trainer.accelerator.num_processes,
        "output_dir": config.output_dir,
        "reward_funcs": trainer.reward_func_names,
        "reward_weights": [round(float(w), 6) for w in trainer.reward_weights],
        "sft_model": sft_model,
        "start_model": start_model,
    }
    if discriminator is not None:
        summary |= discriminator_summary(discriminator)
    if trainer.rl_signal.steps:
        summary |= trainer.rl_signal.record()
    if trainer.is_world_process_zero():
        metrics.write(config.output_dir)
        replace_text(Path(config.output_dir) / "summary.json", json.dumps(summary, indent=1))
        # last: the model folder is finished (checkpoints by size and mtime: hashing gigabytes
        # of optimizer state here would take minutes; their uploads carry sha256)
        # the uploader's snapshots are scratch its thread may still be emptying: not the run's
        mark_complete(
            Path(config.output_dir),
            "train",
            unhashed=CHECKPOINTS,
            leave_out=[*claims.strays, UPLOAD_STAGING],
        )
        if config.upload_final and config.checkpoint_uri:
            check_still_held(config.checkpoint_uri)
            upload_final(config.output_dir, config.checkpoint_uri, step)
    for callback in trainer.callback_handler.callbacks:  # training's collectives are over
        if isinstance(callback, CheckpointUploadCallback):
            callback.finish()
    return summary


def starting_checkpoint(config: TrainConfig) -> str | None:
    """The checkpoint training resumes from: ``resume_from_checkpoint``'s (``latest``: the
    newest of this run's under ``checkpoint_uri``, downloaded), else a fork's starting point
    (``fork_from``, downloaded), else None. A checkpoint downloaded into ``output_dir`` is
    listed in training's claim as its own."""
    from grail.core.checkpoints import download_fork_point, resume_path

    with config.main_process_first(local=True, desc="checkpoint download"):
        resume = resume_path(
            config.resume_from_checkpoint, config.checkpoint_uri, config.output_dir
        )
        if resume is None and config.fork_from:  # a fork with no checkpoint of its own yet
            resume = str(download_fork_point(config.fork_from, config.output_dir))
    out = Path(config.output_dir).resolve()
    if resume and config.process_index == 0 and Path(resume).resolve().parent == out:
        end_write(out, "train", [Path(resume).name])  # downloaded: the run's own
    return resume


def warm_start(config: TrainConfig, model_config: ModelConfig) -> str:
    """The SFT warm start, its folder (``sft``) recorded in training's claim as being written,
    then listed (:func:`grail.core.outputs.begin_write`)."""
    out = Path(config.output_dir).resolve()
    if config.process_index == 0:
        begin_write(out, "train", ["sft"])
    folder = sft_warm_start(config, model_config)
    if config.process_index == 0:
        end_write(out, "train", ["sft"])
    return folder


class ClaimCheckpoints(TrainerCallback):
    """Records each checkpoint in training's claim on its ``output_dir``: as being written when
    the step decides to save (after transformers' flow callback), listed once saved
    (:func:`grail.core.outputs.begin_write`, ``end_write``). A resume then finds every file
    it wrote listed, and refuses anything put there since."""

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save:
            begin_write(Path(args.output_dir).resolve(), "train", [checkpoint(state), CARD])

    on_epoch_end = on_step_end

    def on_save(self, args, state, control, **kwargs):
        names = [checkpoint(state), ".dataset", CARD]
        end_write(Path(args.output_dir).resolve(), "train", names)

    def __init__(self):
        self.strays: list[str] = []  # found when training ended, before the model is saved

    def on_train_end(self, args, state, control, **kwargs):
        self.strays = not_written(Path(args.output_dir))


# TRL's trainers write a model card into output_dir at each checkpoint (create_model_card).
CARD = "README.md"


def checkpoint(state) -> str:
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    return f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"


def check_models(config: TrainConfig, model_config: ModelConfig) -> None:
    """A model to train, and every local model path the run reads present (one line)."""
    if not model_config.model_name_or_path:
        raise GrailError("no model: set model_name_or_path in the recipe or on the command line")
    for name, model in (("model_name_or_path", model_config.model_name_or_path),) + (
        (("gail_model", config.discriminator_model),) if config.discriminator_model else ()
    ):
        if looks_local(model) and not Path(model).expanduser().exists():
            raise GrailError(f"{name}: {model} does not exist")


def train_and_save(trainer, resume: str | None, start_model: str) -> None:
    """Train, then save the model in ``output_dir``; when ``rl_signal_guard: stop`` ended a
    run without signal, its start model is the result (the steps taken moved it by the KL
    term alone), copied when it is a local folder."""
    from grail.train.logs import check_finite_weights

    trainer.train(resume_from_checkpoint=resume)
    no_signal = trainer.rl_signal.stopped_at is not None
    if no_signal and (Path(start_model) / "config.json").is_file():
        if trainer.is_world_process_zero():
            copy_model_files(Path(start_model), Path(trainer.args.output_dir))
        return
    check_finite_weights(trainer.model, f"step {trainer.state.global_step}")
    trainer.save_model(trainer.args.output_dir)  # a collective under ZeRO-3


CHECKPOINTS = "checkpoint-"  # transformers' PREFIX_CHECKPOINT_DIR and the dash after it
TINY_ASSETS = "demo_outputs"  # where `make tiny-assets` writes what recipes/tiny/ names


def claim_output_dir(config: TrainConfig, model_config: ModelConfig) -> None:
    """Refuse an ``output_dir`` that is, holds or lies inside what training reads (the start
    model, the dataset, the SFT data, the discriminator: saving would overwrite them, and step
    0's benchmark would score the trained weights), or that another command wrote
    (:func:`grail.core.outputs.check_owned`); then claim it for training (main process)."""
    from grail.core.outputs import check_own_folder, check_owned, claim_folder

    out = Path(config.output_dir).expanduser().resolve()
    for name, source in read_sources(config, model_config).items():
        if not source or not Path(source).expanduser().exists():
            continue
        source = Path(source).expanduser().resolve()
        where = overlap(out, source)
        if where:
            raise GrailError(
                f"output_dir {config.output_dir} {where} {name} ({source}): training would "
                "overwrite what it reads; choose another output_dir"
            )
    check_own_folder(Path(config.output_dir))  # after: what it reads is named first
    if config.resume_from_checkpoint is None:
        check_fresh_output(out)
    # the main process claims first, the others check after: a rank reading the folder while
    # the claim is being staged (its temporary file there, no claim yet) would refuse it
    with config.main_process_first(local=False, desc="output_dir claim"):
        if config.process_index == 0:
            # what it writes beside its checkpoints: a downloaded dataset, upload snapshots
            remote = (config.dataset or "").startswith("s3://")
            writing = ((".dataset",) if remote else ()) + (
                (UPLOAD_STAGING,) if config.checkpoint_uri else ()
            )
            claim_folder(out, "train", writing)
        else:
            check_owned(out, "train")


def read_sources(config, model_config) -> dict[str, str | None]:
    """What training reads, by field: no output of the run may be, hold or lie inside one."""
    return {
        "model_name_or_path": model_config.model_name_or_path,
        "dataset": config.dataset,
        "sft_dataset": None if config.sft_dataset == "choices" else config.sft_dataset,
        "sft_teacher": config.sft_teacher,
        "sft_reuse": config.sft_reuse,
        "gail_model": config.discriminator_model,
    }


def overlap(out: Path, source: Path) -> str | None:
    """How folder `out` meets folder `source`: "is", "is inside", "holds", or None."""
    if out == source:
        return "is"
    return "is inside" if source in out.parents else "holds" if out in source.parents else None


def check_checkpoint_place(config, model_config) -> None:
    """A folder ``checkpoint_uri`` (file:// or a path) that is, holds or lies inside
    ``output_dir`` or what training reads is refused in one line before anything is taken:
    its lease and run record would sit among the run's files (blocking the folder for good),
    and its uploads would overwrite what training reads."""
    if not config.checkpoint_uri:
        return
    from grail.core.storage import Location

    place = Location.parse(config.checkpoint_uri)
    if place.scheme != "file":
        return
    where = place.local_path.expanduser().resolve()
    others = {"output_dir": config.output_dir} | read_sources(config, model_config)
    for name, folder in others.items():
        if not folder or (name != "output_dir" and not Path(folder).expanduser().exists()):
            continue
        how = overlap(where, Path(folder).expanduser().resolve())
        if how:
            raise GrailError(
                f"checkpoint_uri {config.checkpoint_uri} {how} {name} ({folder}): checkpoints "
                "need a place of their own; choose another checkpoint_uri"
            )


def check_fresh_output(out: Path) -> None:
    """A fresh run (no ``resume_from_checkpoint``) refuses an ``output_dir`` holding a finished
    run or checkpoints: it would overwrite some of them and keep the others, and the benchmark
    would then score two runs' checkpoints as one series."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    if not out.is_dir():
        return
    steps = sorted(
        int(p.name.split("-", 1)[1])
        for p in out.glob(f"{PREFIX_CHECKPOINT_DIR}-*")
        if p.is_dir() and p.name.split("-", 1)[1].isascii() and p.name.split("-", 1)[1].isdigit()
    )
    finished = (out / "summary.json").is_file()
    if not steps and not finished:
        return
    what = "a finished run" if finished else "a run's checkpoints"
    if steps:
        what += f" (checkpoints of steps {', '.join(map(str, steps))})"
    raise GrailError(
        f"output_dir {out}: holds {what}; a fresh run never writes over it: resume it "
        "(--resume_from_checkpoint latest) or choose another output_dir"
    )


def check_tiny_assets(config: TrainConfig, model_config: ModelConfig) -> None:
    """A tiny recipe's dataset or model that is not there yet: one line naming the field and
    the command that builds them (other paths may be hub ids: the loaders judge those)."""
    named = {
        "dataset": config.dataset,
        "model_name_or_path": model_config.model_name_or_path,
        "gail_model": config.discriminator_model,
    }
    for field, value in named.items():
        if value and Path(value).parts[:1] == (TINY_ASSETS,) and not Path(value).exists():
            raise GrailError(
                f"{field} {value} does not exist: make tiny-assets builds what the tiny "
                "recipes name"
            )


def checkpoint_lease(config):
    """The lease on ``checkpoint_uri`` (:mod:`grail.core.lease`), taken once per training: by
    this process unless a launcher above it holds it (our relaunch, node 0 of a TrainJob) or
    it is a process other than rank 0 that someone else's launcher started."""
    from contextlib import nullcontext

    from grail.core.lease import Lease, held_here
    from grail.train.multigpu import Nodes, launched

    rank = os.environ.get("RANK", "0") if launched() else str(Nodes.from_environment().rank)
    if not config.checkpoint_uri or held_here() or rank != "0":
        return nullcontext()
    return Lease(config.checkpoint_uri)


def adapt_to_environment(config: TrainConfig, argv: list[str]) -> None:
    """Quiet line logs without a terminal (unless --disable_tqdm was given); MLflow reporting
    when ``MLFLOW_TRACKING_URI`` is set and the recipe reports nowhere."""
    if "--disable_tqdm" not in argv and not sys.stderr.isatty():
        config.disable_tqdm = True
    if tracking.enabled() and config.report_to in (None, [], ["none"], "none"):
        config.report_to = ["mlflow"]


def looks_local(model: str) -> bool:
    """A filesystem path rather than a hub id (``org/name``).

    >>> looks_local("/models/x"), looks_local("./x"), looks_local("Qwen/Qwen2.5-1.5B-Instruct")
    (True, True, False)
    """
    return model.startswith(("/", "./", "../", "~")) or model.count("/") > 1


def leave_process_group() -> None:
    """A training rank's last act, its collectives done: its process group torn down. Left
    to the interpreter's exit, gloo's threads could abort the rank ("terminate called without
    an active exception", SIGABRT) after it had trained and saved, failing its node's launcher
    while the other node waited 5 minutes on torchrun's exit barrier."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


RESUME_ONLY = ("optimizer.pt", "scheduler.pt", "rng_state", "latest", "zero_to_", "global_step")


def drop_resume_state(output_dir: Path) -> int:
    """Remove from each local checkpoint what only a resume reads (optimizer and DeepSpeed
    shard state, ~8x the model's size), once ``checkpoint_uri`` holds it all; the models
    stay for the benchmark's curve. Returns the bytes freed."""
    freed = 0
    for path in output_dir.glob("checkpoint-*/**/*"):
        if path.name.startswith(RESUME_ONLY) and path.exists():
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            freed += sum(p.stat().st_size for p in files)
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return freed
