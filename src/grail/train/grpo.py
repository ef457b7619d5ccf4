"""TRL's ``GRPOTrainer`` with three passes made cheaper, none changing what is learned:

- **the reference model's linear weights in bf16** when training runs under bf16 autocast on
  one process (:func:`reference_linears_in_bf16`): autocast casts every linear weight to bf16
  on every forward anyway, so its log-probabilities are bit-identical and it holds 2 bytes a
  parameter instead of 4 (embeddings and norms keep their dtype: they feed the residual stream);
- **each forward chunk cut to its own padding** (:func:`trimmed`): TRL pads prompts to the
  longest of the whole generation batch and completions to the longest completion, then runs
  the policy and reference over micro-batches of that width; columns that are padding in every
  row of a chunk are dropped before the forward (the log-probabilities are padded back, so
  every tensor keeps TRL's shape);
- **no second policy forward under vLLM** when it is redundant
  (:meth:`GrailGRPOTrainer.ratio_from_training_forward`): TRL computes the "old" log-probs of
  every completion with a no-grad policy forward, only to divide by vLLM's sampling log-probs
  (its importance-sampling correction). When the whole generation batch trains before the next
  optimizer step (``steps_per_generation == gradient_accumulation_steps`` and one iteration)
  the policy has not moved, so those log-probs are the training forward's own, detached: the
  ratio is computed from them in the loss, with TRL's own modes and clips.

Everything else is TRL's (pinned at 1.16, docs/pins.md#trl-116): the subclass overrides two
methods and wraps a third, and tests/test_grpo_passes.py counts the forwards and FLOPs.
"""

from __future__ import annotations

import math

import torch
from trl import GRPOTrainer

from grail.core.errors import GrailError


class GrailGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with the cheaper passes this module describes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.ref_model is not None and bf16_autocast_single_process(self.args):
            reference_linears_in_bf16(self.accelerator.unwrap_model(self.ref_model))
        self.ratio_from_training = self.use_vllm and redundant_old_forward(self)

    def _generate_and_score_completions(self, inputs):
        if not self.ratio_from_training:
            return super()._generate_and_score_completions(inputs)
        # without the correction TRL skips the no-grad policy forward (the steps are aligned)
        self.vllm_importance_sampling_correction = False
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self.vllm_importance_sampling_correction = True

    def _compute_loss(self, model, inputs):
        if not self.ratio_from_training or "sampling_per_token_logps" not in inputs:
            return super()._compute_loss(model, inputs)
        forward = self._get_per_token_logps_and_entropies

        def with_ratio(*args, **kwargs):
            logps, entropies, aux = forward(*args, **kwargs)
            inputs["importance_sampling_ratio"] = self.sampling_ratio(
                logps.detach(), inputs["sampling_per_token_logps"], inputs
            )
            return logps, entropies, aux

        self._get_per_token_logps_and_entropies = with_ratio
        try:
            return super()._compute_loss(model, inputs)
        finally:
            del self._get_per_token_logps_and_entropies

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
        parts = []
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            first, keep = trimmed(attention_mask[rows], logits_to_keep)
            parts.append(
                super()._get_per_token_logps_and_entropies(
                    model,
                    input_ids[rows, first : input_ids.size(1) - logits_to_keep + keep],
                    attention_mask[rows, first : input_ids.size(1) - logits_to_keep + keep],
                    keep,
                    **kwargs,
                )
            )
        width = logits_to_keep
        logps = torch.cat([padded(p[0], width) for p in parts])
        entropies = None if parts[0][1] is None else torch.cat([padded(p[1], width) for p in parts])
        aux = None if parts[0][2] is None else torch.stack([p[2] for p in parts]).mean()
        return logps, entropies, aux


# keyword arguments of TRL's forward helper that a text-only batch leaves None or sets itself
TEXT_ONLY = {"compute_entropy", "compute_aux_loss"}


def trimmed(attention_mask: torch.Tensor, logits_to_keep: int) -> tuple[int, int]:
    """The first column of a chunk that is not left padding in every row (never inside the
    completion), and how many completion columns to keep (the last one any row uses; at least
    one).

    >>> trimmed(torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]]), 3)
    (1, 2)
    """
    prompt = attention_mask.size(1) - logits_to_keep
    used = attention_mask.any(dim=0).nonzero().flatten()
    first = min(int(used[0]), prompt) if used.numel() else prompt
    completion = attention_mask[:, prompt:].any(dim=0).nonzero().flatten()
    keep = int(completion[-1]) + 1 if completion.numel() else 1
    return first, keep


def padded(values: torch.Tensor, width: int) -> torch.Tensor:
    """``values`` (rows x kept columns) padded with zeros on the right to ``width`` columns."""
    return torch.nn.functional.pad(values, (0, width - values.size(1)))


def redundant_old_forward(trainer: GRPOTrainer) -> bool:
    """Whether TRL's no-grad policy forward under vLLM computes what the training forward
    will: the correction is on, and the whole generation batch trains with the policy as it
    was when it generated (one iteration, one optimizer step per generation batch)."""
    args = trainer.args
    return (
        trainer.vllm_importance_sampling_correction
        and trainer.num_iterations == 1
        and args.steps_per_generation == args.gradient_accumulation_steps
    )


def bf16_autocast_single_process(args) -> bool:
    """Training runs in bf16 autocast over fp32 weights (one process, no DeepSpeed: grail's
    fp32 masters, :func:`grail.train.multigpu.master_dtype`)."""
    from grail.train.multigpu import deepspeed_active

    return bool(args.bf16) and not deepspeed_active(args)


def reference_linears_in_bf16(model: torch.nn.Module) -> int:
    """Cast the reference model's linear layers to bf16 in place, except an LM head tied to the
    embeddings (the embeddings feed the residual stream in their own dtype); returns how many.

    Under bf16 autocast every linear runs in bf16 whatever its weight's dtype, so the
    reference's log-probabilities do not change (tests/test_grpo_passes.py checks bit
    identity).
    """
    embeddings = model.get_input_embeddings()
    tied = embeddings is not None and getattr(embeddings, "weight", None)
    cast = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight is not tied:
            module.to(torch.bfloat16)
            cast += 1
    return cast
