"""The SFT warm start: with ``sft_dataset``, TRL's ``SFTTrainer`` fine-tunes the model on the
replies of a ``grail generate`` output (or, given ``choices``, on the train split's own choices:
behaviour cloning) before GRPO starts from it; the model goes to ``output_dir/sft`` (a LoRA
adapter merged into full weights) with its own ``metrics.json``, and its phase to a nested
MLflow run.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path

from grail.core import tracking
from grail.core.errors import GrailError
from grail.train.config import ModelConfig, TrainConfig
from grail.train.examples import load_examples
from grail.train.logs import MetricsCallback, quiet_logs
from grail.train.trainer import model_init_kwargs

logger = logging.getLogger(__name__)


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


def end_phase(trainer) -> None:
    """Free a finished phase's engine and accelerate's state, keeping the process group: the
    next phase's trainer builds its own ``Accelerator``, which accelerate refuses to give a
    DeepSpeed plugin while an earlier one's state stands (transformers resets the same way
    when it sets up devices)."""
    from accelerate.state import AcceleratorState

    trainer.accelerator.free_memory()
    AcceleratorState._reset_state(reset_partial_state=False)
