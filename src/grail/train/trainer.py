"""The configured ``GRPOTrainer`` (grail's, its passes made cheaper: :mod:`grail.train.grpo`):
the examples, the task's rewards by name (those that read the policy bound to it,
:class:`BindPolicy`; a warning when accuracy would collapse it) and, for GRAIL, the
discriminator's reward and callback (:mod:`grail.train.gail`), the model's load settings
(gradient checkpointing by :mod:`grail.train.memory`), and the callbacks that record, upload
and quiet what training logs; the discriminator's summary once training is over.
"""

from __future__ import annotations

import logging

from transformers import TrainerCallback

from grail.tasks import TASKS
from grail.train.config import ModelConfig, TrainConfig
from grail.train.examples import load_examples, prompt_record
from grail.train.logs import MetricsCallback, StopOnNonFinite, quiet_logs, quiet_series

logger = logging.getLogger(__name__)


def build_trainer(config: TrainConfig, model_config: ModelConfig, resume_from: str | None = None):
    """The configured ``GRPOTrainer`` and our metrics callback."""
    import torch
    from trl import get_peft_config

    from grail.core.rewards import resolve_rewards
    from grail.train.attention import check_trainable
    from grail.train.checkpoint_upload import CheckpointUploadCallback
    from grail.train.memory import choose_gradient_checkpointing
    from grail.train.overrides import GrailGRPOTrainer, score_completions_only_on_cpu
    from grail.train.rl_signal import RLSignal

    cpu = config.use_cpu or not torch.cuda.is_available()
    check_trainable(model_config.attn_implementation, config.share_group_prompts, cpu)
    train_dataset = load_examples(config, config.train_split, config.max_train_rows)
    eval_dataset = (
        load_examples(config, config.eval_split, config.max_eval_rows)
        if config.eval_strategy != "no" and config.eval_split
        else None
    )
    reward_funcs, weights = resolve_rewards(
        config.reward_funcs, config.reward_weights, TASKS[config.task].rewards
    )
    # a reward that reads the policy is a class: this trainer's own instance, bound below
    reward_funcs = [f() if isinstance(f, type) else f for f in reward_funcs]
    base_weights = list(weights)
    TASKS[config.task].before_training(config, weights, train_dataset)
    discriminator_callback = None
    if config.gail_use:
        # the pre-training's prompts come from the whole train split, not GRPO's max_train_rows
        split = train_dataset
        if config.max_train_rows is not None and config.gail_pretrain_prompts:
            split = load_examples(config, config.train_split, None)
        reward, discriminator_callback = build_discriminator(config, resume_from, split)
        reward_funcs.append(reward)
        weights = [w * (1 - config.gail_weight) for w in weights] + [config.gail_weight]
    config.reward_weights = weights
    config.model_init_kwargs = model_init_kwargs(config, model_config)
    choose_gradient_checkpointing(
        config, model_config.model_name_or_path, train_dataset["prompt"], model_config.use_peft
    )
    metrics = MetricsCallback(resume_from, prompt_record(config))
    score_completions_only_on_cpu()
    trainer = GrailGRPOTrainer(
        model=model_config.model_name_or_path,
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        callbacks=[
            SavedOnEveryRank(),
            StopOnNonFinite(),
            metrics,
            BindPolicy(
                reward_funcs, TASKS[config.task].policy_reward, packs=config.share_group_prompts
            ),
        ],
        peft_config=get_peft_config(model_config),
    )
    # told each batch's rewards by the trainer; first to see a log, so MLflow gets its series
    trainer.rl_signal = RLSignal(config.rl_signal_guard, config.rl_signal_patience)
    trainer.callback_handler.callbacks.insert(0, trainer.rl_signal)
    if discriminator_callback is not None:  # saves discriminator/ into each checkpoint ...
        trainer.rl_signal.discriminator = discriminator_callback(
            trainer.reward_weights, base_weights
        )  # (the verdict says why its weight starts at 0, when it does)
        trainer.add_callback(trainer.rl_signal.discriminator)
    if config.checkpoint_uri:  # ... before this callback snapshots and uploads it
        trainer.add_callback(CheckpointUploadCallback(config.checkpoint_uri))
    quiet_logs(trainer)
    quiet_series(trainer)
    return trainer, metrics


class SavedOnEveryRank(TrainerCallback):
    """Holds every rank at each save until all have written their part of the checkpoint.

    transformers' ``Trainer._save_checkpoint`` has each rank write its own RNG state
    (``rng_state_<rank>.pth``) and then run the save's callbacks with no barrier between: the
    callbacks after this one, which list a checkpoint in training's claim
    (:class:`grail.train.stage.ClaimCheckpoints`) and snapshot it for upload
    (:class:`grail.train.checkpoint_upload.CheckpointUploadCallback`) on the first process,
    would otherwise miss a file a slower rank had yet to write (and a retry would then refuse
    it as not training's own)."""

    def on_save(self, args, state, control, **kwargs):
        if args.world_size > 1:
            from accelerate import PartialState

            PartialState().wait_for_everyone()


class BindPolicy(TrainerCallback):
    """Hands the policy, its tokenizer and, with `packs` (``share_group_prompts``), a packer of
    its forwards (:func:`prefix_packer`) to the rewards that read it (instances of the task's
    ``policy_reward``; None: the task has no such reward) when training begins."""

    def __init__(self, reward_funcs: list, policy_reward: type | None, packs: bool = True):
        self.rewards = [
            f for f in reward_funcs if policy_reward is not None and isinstance(f, policy_reward)
        ]
        self.packs = packs

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        packer = prefix_packer(model) if self.packs else None
        for reward in self.rewards:
            reward.bind(model, processing_class, packer)


def prefix_packer(model):
    """:func:`grail.train.grpo.pack_prefixes` for `model` (its attention, dtype, pair cost and
    device): ``packer(sequences, prompts)`` -> packed rows or None; None where the model does
    not score packed rows exactly (:func:`grail.train.overrides.shares_prompts_exactly`)."""
    from grail.train.grpo import attention_pair_cost, pack_prefixes
    from grail.train.overrides import attention_implementation, shares_prompts_exactly

    if not shares_prompts_exactly(model.config):
        return None
    attention = attention_implementation(model.config)
    pair_cost = attention_pair_cost(model.config)

    def packer(sequences: list[list[int]], prompts: list[int]):
        parameter = next(model.parameters())
        return pack_prefixes(
            sequences, prompts, attention, parameter.dtype, pair_cost, parameter.device
        )

    return packer


def model_init_kwargs(config: TrainConfig, model_config: ModelConfig) -> dict:
    """How the trained model loads: the recipe's model fields, with fp32 master weights
    outside DeepSpeed (:func:`grail.train.multigpu.master_dtype`). ``attn_implementation:
    sdpa_flex`` is grail's (:mod:`grail.train.attention`), registered with transformers here."""
    import grail.train.attention  # noqa: F401  (registers sdpa_flex)
    from grail.train.multigpu import deepspeed_active, master_dtype

    deepspeed = deepspeed_active(config)
    return {
        "dtype": master_dtype(model_config.dtype, deepspeed, model_config.use_peft),
        "attn_implementation": model_config.attn_implementation,
        "revision": model_config.model_revision,
        **(config.model_init_kwargs or {}),
    }


def build_discriminator(config: TrainConfig, resume_from: str | None = None, train_dataset=None):
    """The discriminator reward, and a factory for its callback (it needs the trainer's weights).

    The callback restores ``resume_from/discriminator`` (weights, optimizer, replay buffer,
    mixing weight) when the checkpoint has one; otherwise it pre-trains the discriminator on
    ``gail_pretrain_prompts`` seeded rows of `train_dataset`, the train split
    (:func:`pretraining`).
    """
    from grail.train.gail import (
        Discriminator,
        DiscriminatorCallback,
        DiscriminatorReward,
        FeatureDiscriminator,
        ReplayBuffer,
    )

    if config.gail_discriminator == "features":
        discriminator = FeatureDiscriminator(
            TASKS[config.task].discriminator_features,
            device=config.gail_device,
            lr=config.gail_lr,
            max_grad_norm=config.gail_max_grad_norm,
            weight_decay=config.gail_weight_decay,
        )
    else:
        discriminator = Discriminator(
            config.gail_model,
            device=config.gail_device,
            lr=config.gail_lr,
            max_length=config.gail_max_length,
            max_grad_norm=config.gail_max_grad_norm,
            weight_decay=config.gail_weight_decay,
        )
    reward = DiscriminatorReward(
        discriminator,
        alpha=config.gail_alpha,
        eval_mode=config.gail_eval_mode,
        context=config.gail_context,
        task=config.task,
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
            pretraining=pretraining(config, train_dataset),
        )

    return reward, callback


def pretraining(config: TrainConfig, train_dataset):
    """The discriminator's pre-training (:class:`grail.train.gail.Pretraining`) on
    ``gail_pretrain_prompts`` rows of the train split drawn with the run's seed; None when
    that is 0 or there is no dataset."""
    import random

    from grail.train.gail import Pretraining

    if not config.gail_pretrain_prompts or train_dataset is None or not len(train_dataset):
        return None
    picked = random.Random(config.seed).sample(
        range(len(train_dataset)), min(config.gail_pretrain_prompts, len(train_dataset))
    )
    rows = train_dataset.select(picked)
    return Pretraining(
        rows=list(zip(rows["prompt"], rows["gold_index"], rows["n_options"], strict=True)),
        updates=config.gail_pretrain_updates,
        max_new_tokens=config.max_completion_length,
        temperature=config.temperature,
        batch=config.per_device_train_batch_size,
    )


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
        "discriminator_pretrained": callback.pretrained,
        "discriminator_weight": round(callback.weight, 6),
        "discriminator_updates": callback.updates,
    }


def torch_distributed_ready() -> bool:
    import torch.distributed

    return torch.distributed.is_available() and torch.distributed.is_initialized()
