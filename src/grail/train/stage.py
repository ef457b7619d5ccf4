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
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from transformers import TrainerCallback

from grail.core import tracking
from grail.core.errors import GrailError, ProcessesFailed
from grail.core.lease import check_still_held
from grail.core.outputs import mark_complete
from grail.train.config import ModelConfig, TrainConfig, parse_train_args

logger = logging.getLogger("grail.train.stage")


def load_examples(config: TrainConfig, split: str, limit: int | None):
    """A ``datasets.Dataset`` of prompts (conversational) and the columns the rewards read."""
    from datasets import Dataset

    from grail.core.contract import read_dataset
    from grail.core.prompts import to_example

    with config.main_process_first(local=True, desc="dataset download"):
        folder = local_dataset(config.dataset, Path(config.output_dir) / ".dataset")
    if config.task == "summarize":
        return Dataset.from_list(document_examples(config, folder, split, limit))
    table = read_dataset(folder, split=split)
    rows = [
        r
        for r in table.to_pylist()
        if (not config.issues or r["issue"] in config.issues)
        and (not config.studies or r["study"] in config.studies)
    ]
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise GrailError(f"{config.dataset}: no {split} rows left after the issue/study filter")
    options = prompt_options(config)
    return Dataset.from_list([to_example(row, options) for row in rows])


def document_examples(config: TrainConfig, folder: Path, split: str, limit: int | None):
    """The summarize task's prompts, with the columns its rewards read."""
    from grail.tasks.summarize.clean import read_documents
    from grail.tasks.summarize.prompt import BUDGETS, build_messages

    budget = config.summary_budget or BUDGETS[config.summary_mode]
    return [
        {
            "prompt": build_messages(doc["sentences"], config.summary_mode, budget),
            "sentences": doc["sentences"],
            "questions": doc["questions"],
            "summary_mode": config.summary_mode,
            "summary_budget": budget,
        }
        for doc in read_documents(folder, split, limit)
    ]


def prompt_options(config: TrainConfig):
    """The prompt fields of the training config (it extends PromptOptions)."""
    from dataclasses import fields

    from grail.core.prompts import PromptOptions

    return PromptOptions(**{f.name: getattr(config, f.name) for f in fields(PromptOptions)})


def prompt_record(config: TrainConfig) -> dict:
    """How the model was trained to be asked: ``prompt.json`` beside the model and in every
    checkpoint, so `grail benchmark` evaluates it the same way."""
    from dataclasses import asdict

    if config.task == "summarize":
        return {
            "task": "summarize",
            "summary_mode": config.summary_mode,
            "summary_budget": config.summary_budget,
            "max_new_tokens": config.max_completion_length,
        }
    return asdict(prompt_options(config)) | {"max_new_tokens": config.max_completion_length}


def local_dataset(uri: str | None, cache: Path) -> Path:
    """A local path for the dataset, downloading an s3:// folder into `cache` first (once: the
    train and eval splits, and the node's other processes, find it there)."""
    if not uri:
        raise GrailError("no dataset: set `dataset` in the recipe or pass --dataset")
    if not uri.startswith("s3://"):
        return Path(uri.removeprefix("file://"))
    from grail.core.checkpoints import download_into_place
    from grail.core.storage import Location

    if not cache.is_dir():  # renamed into place whole: never seen half-written
        download_into_place(Location.parse(uri), cache, checkpoint=False)
    return cache


class MetricsCallback(TrainerCallback):
    """Collects every training log with its step time into ``metrics.json`` (kept across resumes).

    The file is also written into each checkpoint folder, so a resumed run continues the record.
    """

    def __init__(self, resume_from: str | None = None, prompt: dict | None = None):
        self.prompt = prompt
        previous = Path(resume_from or "") / "metrics.json"
        self.rows: list[dict] = json.loads(previous.read_text()) if previous.is_file() else []
        self._step_started = self._last_log = time.perf_counter()
        self._steps_since_log = 0

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._steps_since_log += 1

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "train_runtime" in logs:
            return
        now = time.perf_counter()
        row = {"step": state.global_step, **logs}
        if self._steps_since_log and not any(k.startswith("eval_") for k in logs):
            row["step_time"] = (now - self._last_log) / self._steps_since_log
            self._last_log, self._steps_since_log = now, 0
        self.rows.append(row)

    def write(self, folder: str | Path) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "metrics.json").write_text(json.dumps(self.rows, indent=1) + "\n")
        if self.prompt is not None:
            (Path(folder) / "prompt.json").write_text(json.dumps(self.prompt, indent=1) + "\n")

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.write(Path(args.output_dir) / f"checkpoint-{state.global_step}")


class LineLogCallback(TrainerCallback):
    """One quiet line per log when stderr is not a terminal (instead of a progress bar)."""

    KEYS = ("loss", "reward", "kl", "gail/disc_loss", "gail/disc_accuracy", "step_time")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "train_runtime" in logs:
            return
        shown = {
            k: v
            for k, v in logs.items()
            if isinstance(v, float | int)
            and (k in self.KEYS or k.startswith("rewards/") and k.endswith("/mean"))
        }
        fields = " ".join(
            f"{k.removeprefix('rewards/').removesuffix('/mean')}={v:.4g}" for k, v in shown.items()
        )
        print(f"step {state.global_step}/{state.max_steps} {fields}", flush=True)


def build_discriminator(config: TrainConfig, resume_from: str | None = None):
    """The discriminator reward, and a factory for its callback (it needs the trainer's weights).

    The callback restores ``resume_from/discriminator`` (weights, optimizer, replay buffer,
    mixing weight) when the checkpoint has one.
    """
    from grail.train.gail import (
        Discriminator,
        DiscriminatorCallback,
        DiscriminatorReward,
        ReplayBuffer,
    )

    discriminator = Discriminator(
        config.gail_model,
        device=config.gail_device,
        lr=config.gail_lr,
        max_length=config.gail_max_length,
        max_grad_norm=config.gail_max_grad_norm,
    )
    reward = DiscriminatorReward(
        discriminator,
        alpha=config.gail_alpha,
        eval_mode=config.gail_eval_mode,
        context=config.gail_context,
    )

    def callback(reward_weights, base_weights):
        return DiscriminatorCallback(
            reward,
            ReplayBuffer(config.gail_replay_size, seed=config.seed),
            minibatch=config.gail_minibatch,
            updates_per_step=config.gail_updates_per_step,
            reward_weights=reward_weights,
            base_weights=base_weights,
            learnable_weight=config.gail_learnable_weight,
            max_weight=config.gail_weight,
            restore_from=resume_from,
        )

    return reward, callback


def score_completions_only_on_cpu() -> None:
    """Make TRL's fused LM head score only the completion positions on CPU, as it does on
    Triton devices.

    TRL's fused LM head scores every position, prompt included, except on Triton devices
    (docs/pins.md#trl-116). Nothing is compiled on CPU and the completion's log-probabilities
    are the same either way (tests/test_train.py), but a tiny-model step would spend most of
    its time on the prompt's logits (bench/train.py measures the difference). Idempotent;
    GPUs keep TRL's own choice.
    """
    from trl.trainer import utils

    chosen = utils._use_triton
    if getattr(chosen, "grail_cpu", False):
        return

    def compact(device) -> bool:
        return device.type == "cpu" or chosen(device)

    compact.grail_cpu, compact.__wrapped__ = True, chosen  # TRL's own, for bench/train.py
    utils._use_triton = compact


def model_init_kwargs(config: TrainConfig, model_config: ModelConfig) -> dict:
    """How the trained model loads: the recipe's model fields, with fp32 master weights
    outside DeepSpeed (:func:`grail.train.multigpu.master_dtype`)."""
    from grail.train.multigpu import deepspeed_active, master_dtype

    deepspeed = deepspeed_active(config)
    return {
        "dtype": master_dtype(model_config.dtype, deepspeed, model_config.use_peft),
        "attn_implementation": model_config.attn_implementation,
        "revision": model_config.model_revision,
        **(config.model_init_kwargs or {}),
    }


def build_trainer(config: TrainConfig, model_config: ModelConfig, resume_from: str | None = None):
    """The configured ``GRPOTrainer`` and our metrics callback."""
    from trl import GRPOTrainer, get_peft_config

    from grail.core.rewards import resolve_rewards
    from grail.train.checkpoint_upload import CheckpointUploadCallback
    from grail.train.constant_rewards import ConstantRewardsCallback
    from grail.train.fields import task_rewards

    train_dataset = load_examples(config, config.train_split, config.max_train_rows)
    eval_dataset = (
        load_examples(config, config.eval_split, config.max_eval_rows)
        if config.eval_strategy != "no" and config.eval_split
        else None
    )
    reward_funcs, weights = resolve_rewards(
        config.reward_funcs, config.reward_weights, task_rewards(config.task)
    )
    base_weights = list(weights)
    discriminator_callback = None
    if config.gail_use:
        reward, discriminator_callback = build_discriminator(config, resume_from)
        reward_funcs.append(reward)
        weights = [w * (1 - config.gail_weight) for w in weights] + [config.gail_weight]
    config.reward_weights = weights
    config.model_init_kwargs = model_init_kwargs(config, model_config)
    metrics = MetricsCallback(resume_from, prompt_record(config))
    score_completions_only_on_cpu()
    trainer = GRPOTrainer(
        model=model_config.model_name_or_path,
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        callbacks=[metrics, ConstantRewardsCallback()],
        peft_config=get_peft_config(model_config),
    )
    if discriminator_callback is not None:  # saves discriminator/ into each checkpoint ...
        trainer.add_callback(discriminator_callback(trainer.reward_weights, base_weights))
    if config.checkpoint_uri:  # ... before this callback snapshots and uploads it
        trainer.add_callback(CheckpointUploadCallback(config.checkpoint_uri))
    quiet_logs(trainer)
    quiet_series(trainer)
    return trainer, metrics


def quiet_logs(trainer) -> None:
    """Without a progress bar, one compact line per log instead of transformers' dict dumps."""
    from transformers import PrinterCallback

    if trainer.args.disable_tqdm:
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(LineLogCallback())


class DropStillSeries(TrainerCallback):
    """Leaves out of every log the series that cannot move, so MLflow's charts open on what
    did: TRL's clip ratios when each generation batch gets one gradient step
    (``num_iterations`` 1: the policy ratio is exactly 1 and nothing is ever clipped)."""

    STILL = ("clip_ratio/", "cispo_clip_ratio")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and args.num_iterations == 1:
            for key in [k for k in logs if k.startswith(self.STILL)]:
                del logs[key]


def quiet_series(trainer) -> None:
    """Before every other callback sees a log (the MLflow one included): the still series
    out. TRL's ``profiling/Time taken: ...`` series go straight to MLflow whenever "mlflow"
    is in ``args.report_to`` (docs/pins.md#trl-116): the MLflow callback was made when the
    trainer was, and keeps logging the training metrics without it; ``step_time`` stays."""
    trainer.callback_handler.callbacks.insert(0, DropStillSeries())
    trainer.args.report_to = [r for r in trainer.args.report_to if r != "mlflow"]


@contextmanager
def mlflow_phase(name: str, enabled: bool):
    """Log a phase into a nested MLflow run under this training's run (created if need be).

    transformers' MLflow callback resumes the run named by ``MLFLOW_RUN_ID``, so it points at
    the nested run during the phase and at the parent afterwards (for the GRPO phase).
    """
    if not enabled:
        yield
        return
    import mlflow

    with (
        mlflow.start_run(run_id=os.environ.get("MLFLOW_RUN_ID")) as parent,
        mlflow.start_run(run_name=name, nested=True) as child,
    ):
        pass
    os.environ["MLFLOW_RUN_ID"] = parent.info.run_id  # for what follows the phase
    with tracking.environment_variable("MLFLOW_RUN_ID", child.info.run_id):
        yield


def prompt_completion(conversation: list[dict]) -> dict:
    """A ``grail generate`` conversation as TRL's conversational prompt-completion pair, so
    that SFT's loss covers the reply only (``completion_only_loss``), not the ~470 prompt
    tokens.

    >>> pair = prompt_completion([{"role": "user", "content": "Q"},
    ...                           {"role": "assistant", "content": "<answer>2</answer>"}])
    >>> pair["prompt"], pair["completion"]
    ([{'role': 'user', 'content': 'Q'}], [{'role': 'assistant', 'content': '<answer>2</answer>'}])
    """
    return {"prompt": conversation[:-1], "completion": conversation[-1:]}


BEHAVIOUR_CLONING = "choices"  # sft_dataset: the train split's own choices


def choice_examples(config: TrainConfig):
    """Behaviour cloning: each train prompt (as GRPO sees it) with the reply that picks the
    option the person chose and, with the opinion task, states their opinion's direction."""
    from datasets import Dataset

    from grail.core.rewards import choice_reply

    examples = load_examples(config, config.train_split, config.max_train_rows)
    return Dataset.from_list(
        [
            {
                "prompt": e["prompt"],
                "completion": [
                    {
                        "role": "assistant",
                        "content": choice_reply(
                            e["gold_index"], e["opinion_direction"] if config.opinion else None
                        ),
                    }
                ],
            }
            for e in examples
        ]
    )


def sft_examples(sft_dataset: str):
    """The SFT warm start's prompt-completion pairs from a ``grail generate`` output."""
    import pyarrow.parquet as pq
    from datasets import Dataset

    path = Path(sft_dataset)
    path = path / "sft.parquet" if path.is_dir() else path
    if not path.is_file():
        raise GrailError(f"{sft_dataset}: no sft.parquet (a `grail generate` output)")
    rows = pq.read_table(path, columns=["messages"]).to_pylist()
    if not rows:
        raise GrailError(f"{path}: no conversations to fine-tune on (no correct completions)")
    return Dataset.from_list([prompt_completion(row["messages"]) for row in rows])


def merge_adapter(folder: Path) -> None:
    """Replace the LoRA adapter saved in `folder` by the merged full model (GRPO continues
    from full weights); the base model is loaded whole, outside any ZeRO-3 partitioning."""
    from peft import AutoPeftModelForCausalLM

    from grail.train.gail import outside_zero3

    with outside_zero3():
        merged = AutoPeftModelForCausalLM.from_pretrained(str(folder)).merge_and_unload()
    for name in ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"):
        (folder / name).unlink(missing_ok=True)
    merged.save_pretrained(str(folder))


def sft_warm_start(config: TrainConfig, model_config: ModelConfig) -> str:
    """Fine-tune on ``sft_dataset`` (or, given ``choices``, the train split's own choices:
    behaviour cloning) with TRL's SFTTrainer (loss on the replies only); returns the
    fine-tuned model's folder.

    The model is saved with ``trainer.save_model``, which gathers ZeRO-3's partitioned weights
    and writes on the main process only.
    """
    from trl import SFTConfig, SFTTrainer, get_peft_config

    from grail.train.multigpu import configured_state

    if config.sft_dataset == BEHAVIOUR_CLONING:
        examples = choice_examples(config)
    else:
        examples = sft_examples(config.sft_dataset)
    out = Path(config.output_dir) / "sft"
    args = SFTConfig(
        output_dir=str(out),
        num_train_epochs=config.sft_num_train_epochs,
        max_steps=config.sft_max_steps,
        learning_rate=config.sft_learning_rate,
        max_length=config.sft_max_length,
        completion_only_loss=True,
        per_device_train_batch_size=min(config.per_device_train_batch_size, len(examples)),
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        logging_steps=config.logging_steps,
        save_strategy="no",
        report_to=config.report_to,
        use_cpu=config.use_cpu,
        bf16=config.bf16,
        seed=config.seed,
        disable_tqdm=config.disable_tqdm,
        accelerator_config=configured_state(),
        model_init_kwargs={
            k: v for k, v in model_init_kwargs(config, model_config).items() if v is not None
        },
    )
    metrics = MetricsCallback()
    trainer = SFTTrainer(
        model=model_config.model_name_or_path,
        args=args,
        train_dataset=examples,
        callbacks=[metrics],
        peft_config=get_peft_config(model_config),
    )
    quiet_logs(trainer)
    with mlflow_phase("sft", "mlflow" in (config.report_to or [])):
        trainer.train()
    trainer.save_model(str(out))  # a collective under ZeRO-3: every process calls it
    if trainer.is_world_process_zero():
        if model_config.use_peft:
            merge_adapter(out)
        metrics.write(out)
    trainer.accelerator.wait_for_everyone()
    logger.info(
        "SFT warm-start: %d steps on %d conversations -> %s",
        trainer.state.global_step,
        len(examples),
        out,
    )
    end_phase(trainer)
    return str(out)


def end_phase(trainer) -> None:
    """Free a finished phase's engine and accelerate's state, keeping the process group: the
    next phase's trainer builds its own ``Accelerator``, which accelerate refuses to give a
    DeepSpeed plugin while an earlier one's state stands (transformers resets the same way
    when it sets up devices)."""
    from accelerate.state import AcceleratorState

    trainer.accelerator.free_memory()
    AcceleratorState._reset_state(reset_partial_state=False)


def discriminator_callback(trainer):
    from grail.train.gail import DiscriminatorCallback

    found = [c for c in trainer.callback_handler.callbacks if isinstance(c, DiscriminatorCallback)]
    return found[0] if found else None


def discriminator_summary(callback) -> dict:
    """Where the discriminator was restored from, its final weight, and the digest of every
    rank's replica (a collective: every process calls it)."""
    from accelerate.utils import gather_object

    digest = callback.reward.discriminator.sha256()
    distributed = torch_distributed_ready()
    return {
        "discriminator_sha256": gather_object([digest]) if distributed else [digest],
        "discriminator_restored_from": callback.restored_from,
        "discriminator_weight": round(callback.weight, 6),
        "discriminator_updates": callback.updates,
    }


def torch_distributed_ready() -> bool:
    import torch.distributed

    return torch.distributed.is_available() and torch.distributed.is_initialized()


def looks_local(model: str) -> bool:
    """A filesystem path rather than a hub id (``org/name``).

    >>> looks_local("/models/x"), looks_local("./x"), looks_local("Qwen/Qwen2.5-1.5B-Instruct")
    (True, True, False)
    """
    return model.startswith(("/", "./", "../", "~")) or model.count("/") > 1


def start_step(checkpoint: str | None) -> int:
    """The global step a checkpoint folder was saved at (0 without one)."""
    state = Path(checkpoint or "") / "trainer_state.json"
    return int(json.loads(state.read_text())["global_step"]) if state.is_file() else 0


def finished_step(checkpoint: str | None, max_steps: int) -> int | None:
    """The checkpoint's step when it already reached the run's last step, else None.

    Resuming a finished run must train nothing: transformers would run one more step. The
    target is ``max_steps`` when set, else the one the checkpoint was trained towards.
    """
    state = Path(checkpoint or "") / "trainer_state.json"
    if not state.is_file():
        return None
    saved = json.loads(state.read_text())
    target = max_steps if max_steps and max_steps > 0 else saved.get("max_steps", 0)
    return saved["global_step"] if target and saved["global_step"] >= target else None


def run(config: TrainConfig, model_config: ModelConfig) -> dict:
    """Train and save; returns a summary (also written as ``output_dir/summary.json``)."""
    from grail.core.checkpoints import resume_path, upload_final
    from grail.train.checkpoint_upload import CheckpointUploadCallback

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if not model_config.model_name_or_path:
        raise GrailError("no model: set model_name_or_path in the recipe or on the command line")
    for name, model in (("model_name_or_path", model_config.model_name_or_path),) + (
        (("gail_model", config.gail_model),) if config.gail_use else ()
    ):
        if looks_local(model) and not Path(model).expanduser().exists():
            raise GrailError(f"{name}: {model} does not exist")
    if config.upload_final and not config.checkpoint_uri:
        raise GrailError("upload_final: set checkpoint_uri, where the final model goes")
    with config.main_process_first(local=True, desc="checkpoint download"):
        resume = resume_path(
            config.resume_from_checkpoint, config.checkpoint_uri, config.output_dir
        )
    sft_model, started = None, time.perf_counter()
    if config.sft_dataset:  # a resumed run keeps the SFT model it already made
        done = Path(config.output_dir) / "sft" / "config.json"
        sft_model = (
            str(done.parent) if resume and done.is_file() else sft_warm_start(config, model_config)
        )
        if not config.rl:
            return cloned_result(config, model_config.model_name_or_path, sft_model, started)
        model_config.model_name_or_path = sft_model
    start_model = model_config.model_name_or_path  # step 0, benchmarked beside the checkpoints
    if Path(start_model).expanduser().exists():
        start_model = str(Path(start_model).expanduser().resolve())
    finished = finished_step(resume, config.max_steps)
    if finished is not None:  # nothing left to train: the checkpoint is the final model
        logger.info("%s already reached step %d: training 0 steps", resume, finished)
        model_config.model_name_or_path = resume
    trainer, metrics = build_trainer(config, model_config, resume)
    discriminator = discriminator_callback(trainer)
    started = time.perf_counter()
    if finished is None:
        trainer.train(resume_from_checkpoint=resume)
        trainer.save_model(config.output_dir)  # a collective under ZeRO-3
    else:  # no DeepSpeed engine without train(): the checkpoint's own model files
        if discriminator is not None:  # on_train_begin does not run: restore it here
            discriminator.on_train_begin(trainer.args, trainer.state, trainer.control)
        if trainer.is_world_process_zero():
            copy_model_files(Path(resume), Path(config.output_dir))
    step = finished if finished is not None else trainer.state.global_step
    summary = {
        "global_step": step,
        "steps_trained": step - (finished if finished is not None else start_step(resume)),
        "resumed_from": resume,
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
    if trainer.is_world_process_zero():
        metrics.write(config.output_dir)
        (Path(config.output_dir) / "summary.json").write_text(json.dumps(summary, indent=1))
        mark_complete(Path(config.output_dir), "train")  # last: the model folder is finished
        if config.upload_final and config.checkpoint_uri:
            check_still_held(config.checkpoint_uri)
            upload_final(config.output_dir, config.checkpoint_uri, step)
    for callback in trainer.callback_handler.callbacks:  # training's collectives are over
        if isinstance(callback, CheckpointUploadCallback):
            callback.finish()
    return summary


TRAINING_STATE = ("optimizer.pt", "scheduler.pt", "trainer_state.json", "latest", "zero_to_")
RESUME_ONLY = ("optimizer.pt", "scheduler.pt", "rng_state", "latest", "zero_to_", "global_step")


def cloned_result(config: TrainConfig, start: str, sft_model: str, started: float) -> dict:
    """With ``rl`` false the warm start's model is the result (behaviour cloning alone): its
    files, metrics and prompt in ``output_dir``, its SFT steps as the run's last step, and the
    model it started from as step 0, so the benchmark scores what cloning added."""
    from accelerate import PartialState

    sft, out = Path(sft_model), Path(config.output_dir)
    rows = (
        json.loads((sft / "metrics.json").read_text()) if (sft / "metrics.json").is_file() else []
    )
    step = max((int(r.get("step", 0)) for r in rows), default=0)
    if Path(start).expanduser().exists():
        start = str(Path(start).expanduser().resolve())
    summary = {
        "global_step": step,
        "steps_trained": step,
        "resumed_from": None,
        "seconds": round(time.perf_counter() - started, 2),
        "world_size": PartialState().num_processes,
        "output_dir": config.output_dir,
        "reward_funcs": [],
        "reward_weights": [],
        "sft_model": sft_model,
        "start_model": start,
    }
    if PartialState().is_main_process:
        copy_model_files(sft, out)
        (out / "prompt.json").write_text(json.dumps(prompt_record(config), indent=1) + "\n")
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        mark_complete(out, "train")
    return summary


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


def copy_model_files(checkpoint: Path, out: Path) -> None:
    """The model files of a checkpoint (what ``save_model`` writes: weights, config, tokenizer,
    metrics) into `out`; not its optimizer, scheduler, RNG or DeepSpeed shard state."""
    out.mkdir(parents=True, exist_ok=True)
    for path in checkpoint.iterdir():
        if path.is_file() and not path.name.startswith((*TRAINING_STATE, "rng_state")):
            shutil.copy2(path, out / path.name)


def adapt_to_environment(config: TrainConfig, argv: list[str]) -> None:
    """Quiet line logs without a terminal (unless --disable_tqdm was given); MLflow reporting
    when ``MLFLOW_TRACKING_URI`` is set and the recipe reports nowhere."""
    if "--disable_tqdm" not in argv and not sys.stderr.isatty():
        config.disable_tqdm = True
    if tracking.enabled() and config.report_to in (None, [], ["none"], "none"):
        config.report_to = ["mlflow"]


TINY_ASSETS = "demo_outputs"  # where `make tiny-assets` writes what recipes/tiny/ names


def check_tiny_assets(config: TrainConfig, model_config: ModelConfig) -> None:
    """A tiny recipe's dataset or model that is not there yet: one line naming the field and
    the command that builds them (other paths may be hub ids: the loaders judge those)."""
    named = {
        "dataset": config.dataset,
        "model_name_or_path": model_config.model_name_or_path,
        "gail_model": config.gail_model if config.gail_use else None,
    }
    for field, value in named.items():
        if value and Path(value).parts[:1] == (TINY_ASSETS,) and not Path(value).exists():
            raise GrailError(
                f"{field} {value} does not exist: make tiny-assets builds what the tiny "
                "recipes name"
            )


def train(argv: list[str]) -> dict:
    """The one training entry point (``grail train`` and the KFP train task): relaunches under
    accelerate when several processes are asked for (``num_processes``, or one per visible
    GPU), else trains here; returns the run summary (``output_dir/summary.json``)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    config, model_config = parse_train_args(argv)
    check_tiny_assets(config, model_config)
    with checkpoint_lease(config):
        summary = _train(argv, config, model_config)
    leave_process_group()
    return summary


def leave_process_group() -> None:
    """A training rank's last act, its collectives done: its process group torn down. Left
    to the interpreter's exit, gloo's threads could abort the rank ("terminate called without
    an active exception", SIGABRT) after it had trained and saved, failing its node's launcher
    while the other node waited 5 minutes on torchrun's exit barrier."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


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


def main(argv: list[str]) -> None:
    """``grail train`` entry point."""
    if argv == ["--help-all"]:
        argv = ["--help"]
    summary = train(argv)
    if "global_step" not in summary:
        print(f"node {summary['node']} trained its share; the run's summary is on node 0")
        return
    print(
        f"trained {summary['global_step']} steps on {summary['world_size']} process(es) in "
        f"{summary['seconds']} s; model and metrics.json in {summary['output_dir']}"
    )
