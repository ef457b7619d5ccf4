"""Every use grail makes of a private name of a library it trains with (TRL, transformers,
accelerate), in this one module: each override or read below stands on an upstream function
that its library may change in any release without notice.

:data:`UPSTREAM` names each such function, the sha256 of its source at the pinned version
(docs/pins.md) and why grail depends on it. tests/test_overrides.py recomputes every digest:
an upgrade that changes one fails that test, naming the function to re-read before the digest
is updated; the same test refuses a private name of a library used anywhere else in grail.

- :class:`GrailGRPOTrainer`: TRL's ``GRPOTrainer`` with five methods overridden for the cheaper
  passes of :mod:`grail.train.grpo` (the passes themselves are public functions there) and
  the RL signal (:mod:`grail.train.rl_signal`);
- :class:`ExtraSignatureColumns`, :func:`logged_metrics`: behaviour cloning's slate sizes kept
  in the batch, and its choice log-loss in TRL's logged metrics (:mod:`grail.train.sft`);
- :func:`attention_implementation`: the attention a model config runs;
- :func:`score_completions_only_on_cpu`: TRL's fused LM head scores only completions on CPU;
- :func:`outside_zero3`: a model loaded whole while a ZeRO-3 config is registered;
- :func:`reset_accelerator_state`: the next training phase builds its own accelerator;
- :func:`one_input_grads_hook`: a patch of transformers' public ``enable_input_require_grads``
  on the model checkpointing runs on (pinned as the private names are).
"""

from __future__ import annotations

import math
import time
import types
from contextlib import contextmanager

import torch
from peft import PeftModel
from trl import GRPOTrainer

from grail.core.errors import GrailError
from grail.core.pins import changed_since_pinned, upstream_function
from grail.train.grpo import (
    MASKED_ATTENTION,
    TEXT_ONLY,
    Packed,
    attention_pair_cost,
    bf16_autocast_single_process,
    pack_groups,
    padded,
    redundant_old_forward,
    reference_linears_in_bf16,
    shuffle_groups,
    trimmed,
)

# "module:qualified name" of each upstream function grail overrides, wraps, patches or whose
# private state it reads -> (the first 16 hex digits of the sha256 of its source at the pinned
# version, why grail depends on it)
UPSTREAM = {
    "trl.trainer.grpo_trainer:GRPOTrainer._generate_and_score_completions": (
        "1fa48922792dcd5c",
        "overridden: the vLLM correction switched off around it when the training forward "
        "gives the ratio (it then skips the no-grad policy forward)",
    ),
    "trl.trainer.grpo_trainer:GRPOTrainer._calculate_rewards": (
        "736ae29b083840b5",
        "overridden: the gathered rewards told to the RL-signal guard",
    ),
    "trl.trainer.grpo_trainer:GRPOTrainer._compute_loss": (
        "80295546bbdbf6f7",
        "overridden: the importance-sampling ratio computed from the training forward, and "
        "the sampling/* mismatch metrics TRL logs only under its own correction logged there",
    ),
    "trl.trainer.grpo_trainer:GRPOTrainer._get_per_token_logps_and_entropies": (
        "ea73c3909275851d",
        "overridden: chunks trimmed to their padding, groups packed after one prompt; TRL's "
        "keyword arguments beyond TEXT_ONLY send it back to TRL's",
    ),
    "trl.trainer.grpo_trainer:GRPOTrainer._prepare_inputs": (
        "f824e7fb07147956",
        "overridden: the generation batch shuffled by group (its shuffle_sequence_dict "
        "swapped for the call)",
    ),
    "trl.extras.profiling:profiling_context": (
        "1304522160265854",
        "swapped in grpo_trainer's namespace while grail's trainer trains: each phase's "
        "seconds also go to the logged metrics (phase_timings)",
    ),
    "trl.trainer.utils:shuffle_sequence_dict": (
        "bab038755e57ed2b",
        "swapped in grpo_trainer's namespace during _prepare_inputs; shuffle_groups falls back "
        "to it",
    ),
    "trl.trainer.utils:_use_triton": (
        "f0510984e05ac05c",
        "wrapped: the fused LM head's compact path taken on CPU too",
    ),
    "trl.trainer.sft_trainer:SFTTrainer.log": (
        "0d4c8e5d64f894ac",
        "reads _metrics, where behaviour cloning appends its choice log-loss",
    ),
    "transformers.trainer:Trainer._set_signature_columns_if_needed": (
        "2f1d3f7ae435e00f",
        "overridden: n_options kept among the columns the model's signature allows",
    ),
    "transformers.integrations.deepspeed:unset_hf_deepspeed_config": (
        "088d722afab96382",
        "its _hf_deepspeed_config_weak_ref read to restore the ZeRO-3 config after a whole load",
    ),
    "transformers.configuration_utils:PreTrainedConfig._attn_implementation": (
        "0ecad559168ed33b",
        "read: whether a packed group's mask suits the model's attention",
    ),
    "transformers.modeling_utils:PreTrainedModel.enable_input_require_grads": (
        "40cef9819fccca32",
        "patched per model (one_input_grads_hook): it replaces its input-embedding hook "
        "instead of adding one more each time TRL's checkpointing toggle calls it",
    ),
    "transformers.modeling_utils:PreTrainedModel.disable_input_require_grads": (
        "3d2fbf825f7d6bef",
        "called by one_input_grads_hook to remove the hook before one is added",
    ),
    "accelerate.state:AcceleratorState._reset_state": (
        "ba8df8354c8a072d",
        "called between training phases: accelerate refuses a second DeepSpeed plugin",
    ),
}


class GrailGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with the cheaper passes :mod:`grail.train.grpo` describes, and the RL
    signal told to :attr:`rl_signal`."""

    def __init__(self, *args, **kwargs):
        self.rl_signal = None  # grail.train.rl_signal.RLSignal, set by build_trainer
        super().__init__(*args, **kwargs)
        if self.ref_model is not None and bf16_autocast_single_process(self.args):
            reference_linears_in_bf16(self.accelerator.unwrap_model(self.ref_model))
        self.ratio_from_training = self.use_vllm and redundant_old_forward(self)
        one_input_grads_hook(self.accelerator.unwrap_model(self.model))

    def _generate_and_score_completions(self, inputs):
        if not self.ratio_from_training:
            return super()._generate_and_score_completions(inputs)
        # without the correction TRL skips the no-grad policy forward (the steps are aligned)
        self.vllm_importance_sampling_correction = False
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self.vllm_importance_sampling_correction = True

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's rewards (every process's, gathered), told to :attr:`rl_signal` as the
        weighted totals GRPO's advantages are made of (training batches only)."""
        rewards_per_func = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        if self.rl_signal is not None and self.model.training:
            self.observe_signal(rewards_per_func, completions)
        return rewards_per_func

    def observe_signal(self, rewards_per_func: torch.Tensor, completions: list) -> None:
        from grail.core.rewards import completion_text
        from grail.train.rl_signal import thought_tags, thoughts

        weights = self.reward_weights.to(rewards_per_func.device)
        totals = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        totals[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # TRL's unscorable rows
        texts = [completion_text(c) for c in completions]
        with_thought, chars = thoughts(texts)
        counts = torch.tensor(
            [len(completions), with_thought, chars, thought_tags(texts)],
            device=self.accelerator.device,
        )
        replies, with_thought, chars, tagged = (
            self.accelerator.gather(counts).view(-1, 4).sum(0).tolist()
        )
        names = self.reward_func_names
        weight = weights[names.index("discriminator")].item() if "discriminator" in names else None
        self.rl_signal.observe(
            totals.tolist(), self.num_generations, replies, (with_thought, chars, tagged), weight
        )

    def _compute_loss(self, model, inputs):
        if not self.ratio_from_training or "sampling_per_token_logps" not in inputs:
            return super()._compute_loss(model, inputs)
        forward = self._get_per_token_logps_and_entropies

        def with_ratio(*args, **kwargs):
            logps, entropies, aux = forward(*args, **kwargs)
            ratio = self.sampling_ratio(logps.detach(), inputs["sampling_per_token_logps"], inputs)
            inputs["importance_sampling_ratio"] = ratio
            self.log_sampling_mismatch(logps.detach(), inputs, ratio)
            return logps, entropies, aux

        wrapped = self.__dict__.get("_get_per_token_logps_and_entropies")  # e.g. a counter's
        self._get_per_token_logps_and_entropies = with_ratio
        try:
            return super()._compute_loss(model, inputs)
        finally:
            if wrapped is None:
                del self._get_per_token_logps_and_entropies
            else:
                self._get_per_token_logps_and_entropies = wrapped

    def log_sampling_mismatch(self, logps, inputs, ratio) -> None:
        """The generation/training mismatch TRL logs where it computes the ratio itself (its
        ``sampling/sampling_logp_difference/{mean,max}`` and
        ``sampling/importance_sampling_ratio/{min,mean,max}``, gathered over processes), here
        per training micro-batch: the logged max and min are then the mean over a logging
        step's micro-batches of each one's max and min."""
        from trl.trainer.utils import nanmax, nanmin

        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        mask = mask.bool()
        delta = torch.abs(logps - inputs["sampling_per_token_logps"])
        delta = delta[mask & ~torch.isnan(delta)]
        flat = (
            ratio.flatten()
            if self.vllm_importance_sampling_mode.startswith("sequence")
            else (ratio[mask])
        )
        zero = torch.tensor(0.0, device=logps.device)
        metrics = logged_metrics(self, "train" if self.model.training else "eval")
        gather = self.accelerator.gather
        for name, values in (
            ("sampling_logp_difference", delta),
            ("importance_sampling_ratio", flat),
        ):
            low, mean, high = (
                (values.min(), values.mean(), values.max()) if values.numel() else (zero,) * 3
            )
            if name == "importance_sampling_ratio":
                metrics[f"sampling/{name}/min"].append(nanmin(gather(low)).item())
            metrics[f"sampling/{name}/mean"].append(gather(mean).nanmean().item())
            metrics[f"sampling/{name}/max"].append(nanmax(gather(high)).item())

    def train(self, *args, **kwargs):
        """TRL's training, its phase timings (:func:`phase_timings`) kept in the logs."""
        with phase_timings(self):
            return super().train(*args, **kwargs)

    def sampling_ratio(self, logps, sampling_logps, inputs) -> torch.Tensor:
        """TRL's vLLM importance-sampling ratio (its modes and clips), from the policy's
        log-probs of this micro-batch."""
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        difference = torch.nan_to_num((logps - sampling_logps) * mask, nan=0.0)
        mode = self.vllm_importance_sampling_mode
        if mode.startswith("sequence"):
            difference = difference.sum(dim=-1, keepdim=True)
        ratio = torch.exp(difference)
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if mode.endswith("truncate"):
            return torch.clamp(ratio, min=low, max=high)
        if mode.endswith("mask"):
            low = -math.inf if low is None else low
            high = math.inf if high is None else high
            return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
        raise GrailError(f"vllm_importance_sampling_mode: unknown mode {mode!r}")

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, **kwargs
    ):
        if any(v is not None for k, v in kwargs.items() if k not in TEXT_ONLY):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, **kwargs
            )
        batch_size = batch_size or input_ids.size(0)
        share = self.shares_group_prompts(model, kwargs)
        if share:
            unwrapped = self.accelerator.unwrap_model(model)
            pair_cost = attention_pair_cost(unwrapped.config)
            attention = attention_implementation(unwrapped.config)
            dtype = unwrapped.get_input_embeddings().weight.dtype
        parts = []
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            first, keep = trimmed(attention_mask[rows], logits_to_keep)
            ids = input_ids[rows, first : input_ids.size(1) - logits_to_keep + keep]
            mask = attention_mask[rows, first : input_ids.size(1) - logits_to_keep + keep]
            packed = pack_groups(ids, mask, keep, attention, dtype, pair_cost) if share else None
            if packed is None:
                parts.append(
                    super()._get_per_token_logps_and_entropies(model, ids, mask, keep, **kwargs)
                )
            else:
                parts.append(self.packed_logps(model, packed, kwargs.get("compute_entropy")))
        width = logits_to_keep
        logps = torch.cat([padded(p[0], width) for p in parts])
        entropies = None if parts[0][1] is None else torch.cat([padded(p[1], width) for p in parts])
        aux = None if parts[0][2] is None else torch.stack([p[2] for p in parts]).mean()
        return logps, entropies, aux

    def shares_group_prompts(self, model, kwargs) -> bool:
        """Whether this forward packs each group's completions after one copy of its prompt:
        the recipe asks for it (``share_group_prompts``), the model scores a packed group
        exactly (:func:`shares_prompts_exactly`) and no MoE load-balancing loss is asked for."""
        config = self.accelerator.unwrap_model(model).config
        return (
            self.args.share_group_prompts
            and shares_prompts_exactly(config)
            and not kwargs.get("compute_aux_loss")
        )

    def _prepare_inputs(self, generation_batch):
        """TRL's, with a generation batch shuffled by group (:func:`shuffle_groups`) when
        prompts are shared, so each training micro-batch holds whole groups. With one optimizer
        step per generation batch (the recipes'), the step's gradient is the same either way
        for a loss normalised per sequence or by the generation batch's tokens (``dapo``, the
        recipes', ``grpo``, ``dr_grpo``); ``bnpo``'s per-micro-batch mean depends on which
        rows meet in a micro-batch, under TRL's shuffle as under this one."""
        if not (self.model.training and self.args.share_group_prompts):
            return super()._prepare_inputs(generation_batch)
        import trl.trainer.grpo_trainer as trl_grpo

        row_wise, trl_grpo.shuffle_sequence_dict = trl_grpo.shuffle_sequence_dict, shuffle_groups
        try:
            return super()._prepare_inputs(generation_batch)
        finally:
            trl_grpo.shuffle_sequence_dict = row_wise

    def packed_logps(self, model, packed: Packed, compute_entropy: bool | None):
        """TRL's fused head over a packed chunk (:func:`pack_groups`), each completion's
        log-probabilities (and entropies) put back in its row and column."""
        with self.accelerator.autocast():
            outputs = model(**packed.model_inputs(), fused_lm_head=True)
        logps = packed.unpack(outputs.log_probs)
        entropies = packed.unpack(outputs.entropy) if compute_entropy else None
        return logps, entropies, None


class TimedPhase:
    """TRL's profiling context of one phase, its seconds also appended to the trainer's logged
    metrics as ``profiling/PHASE`` (averaged per logging step by TRL's ``log``)."""

    def __init__(self, inner, trainer, name: str):
        self.inner, self.trainer, self.name = inner, trainer, name

    def __enter__(self):
        self.started = time.perf_counter()
        return self.inner.__enter__()

    def __exit__(self, *exc):
        done = self.inner.__exit__(*exc)
        mode = "train" if self.trainer.model.training else "eval"
        seconds = time.perf_counter() - self.started
        logged_metrics(self.trainer, mode)[f"profiling/{self.name}"].append(seconds)
        return done


@contextmanager
def phase_timings(trainer):
    """While `trainer` trains: each phase TRL's GRPO trainer times with ``profiling_context``
    (``vLLM.generate``, ``sync_weights``, ``transformers.generate``, each reward function) also
    in its logged metrics, so they reach metrics.json and MLflow with every log row (TRL's own
    goes to MLflow only when its process holds an active MLflow run)."""
    import trl.trainer.grpo_trainer as trl_grpo

    own = trl_grpo.profiling_context

    def timed(self, name):
        inner = own(self, name)
        return TimedPhase(inner, self, name) if self is trainer else inner

    trl_grpo.profiling_context = timed
    try:
        yield
    finally:
        trl_grpo.profiling_context = own


class ExtraSignatureColumns:
    """A transformers ``Trainer`` mixin: the dataset columns in ``extra_columns`` are kept
    beside those the model's forward takes (the trainer drops every other column)."""

    extra_columns: tuple[str, ...] = ()

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        self._signature_columns = [*self._signature_columns, *self.extra_columns]


def logged_metrics(trainer, mode: str) -> dict[str, list]:
    """TRL's metrics of `mode` (train, eval) that its ``log`` averages and logs: a value
    appended to a name's list is logged at the next logging step."""
    return trainer._metrics[mode]


def attention_implementation(config) -> str | None:
    """The attention a model's config runs (sdpa, eager, flash_attention_2, ...)."""
    return config._attn_implementation


def shares_prompts_exactly(config) -> bool:
    """Whether a model scores a packed group as it scores the group's rows: SDPA, eager or
    ``sdpa_flex`` attention (a 4-D or block mask is taken as given), rotary positions
    (relative: the prompt's offset does not matter), full attention in every layer (a 4-D
    mask would drop a sliding window), and no router logits asked for (their balancing loss
    reads the mask)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text, "layer_types", None) or ["full_attention"]
    return (
        attention_implementation(config) in MASKED_ATTENTION
        and (getattr(text, "rope_parameters", None) or getattr(text, "rope_theta", None))
        is not None
        and not getattr(text, "use_sliding_window", False)
        and all(layer == "full_attention" for layer in layers)
        and not getattr(text, "output_router_logits", False)
    )


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


@contextmanager
def trls_own_head_choice():
    """While it lasts, TRL's own choice of the fused head's path (what
    :func:`score_completions_only_on_cpu` replaced), for bench/train.py's comparison."""
    from trl.trainer import utils

    chosen = utils._use_triton
    utils._use_triton = getattr(chosen, "__wrapped__", chosen)
    try:
        yield
    finally:
        utils._use_triton = chosen


@contextmanager
def outside_zero3():
    """Load a model whole while the trainer's DeepSpeed ZeRO-3 config is active.

    ``GRPOConfig`` with a ZeRO-3 config registers it with transformers, and ``from_pretrained``
    then builds every model inside ``deepspeed.zero.Init``: the weights are partitioned across
    ranks (an empty embedding on each) and the first reward call fails. The discriminator is
    not a DeepSpeed model, so the registration is lifted while it loads.
    """
    from transformers.integrations import deepspeed as hf_deepspeed

    active = hf_deepspeed._hf_deepspeed_config_weak_ref  # noqa: SLF001 (no public getter)
    config = active() if active is not None else None
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if config is not None:
            hf_deepspeed.set_hf_deepspeed_config(config)


def reset_accelerator_state() -> None:
    """Forget accelerate's shared state (not the partial state: the processes stay), so the
    next trainer can build an ``Accelerator`` with its own DeepSpeed plugin."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=False)


def one_input_grads_hook(model: torch.nn.Module) -> None:
    """Make ``enable_input_require_grads`` replace its input-embedding hook rather than add one
    more (docs/pins.md#transformers-517), on the transformers model that checkpointing runs on
    (a peft model's base model)."""
    base = model.get_base_model() if isinstance(model, PeftModel) else model

    def replacing(self):
        self.disable_input_require_grads()
        type(self).enable_input_require_grads(self)

    base.enable_input_require_grads = types.MethodType(replacing, base)


def upstream_source(name: str) -> str:
    """The source of an :data:`UPSTREAM` function (``module:qualified name``) as installed; a
    function grail has wrapped in this process is read through its ``__wrapped__``."""
    import inspect

    found = upstream_function(name)
    if getattr(found, "grail_cpu", False):
        found = found.__wrapped__
    return inspect.getsource(found)


def upstream_changes(source=upstream_source) -> list[str]:
    """Each :data:`UPSTREAM` function whose source no longer has its pinned digest, as
    ``NAME: why grail depends on it``: the functions to re-read before the pin moves."""
    return changed_since_pinned(UPSTREAM, source)
