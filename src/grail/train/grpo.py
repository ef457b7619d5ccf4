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
  ratio is computed from them in the loss, with TRL's own modes and clips;
- **each group's prompt sent through once** (:func:`pack_groups`, ``share_group_prompts``): the
  completions of one prompt (consecutive rows: TRL repeats each prompt ``num_generations``
  times) are packed into one sequence after a single copy of their prompt, each completion
  attending to the prompt and to itself alone (a 4-D mask, positions continuing from the
  prompt), so the policy, the reference and the old-log-prob pass read the prompt once per group
  instead of once per completion. The log-probabilities are the same up to rounding (RoPE is
  relative; the sums run in another order), not bit-identical: tests/test_grpo_passes.py.

Everything else is TRL's (pinned at 1.16, docs/pins.md#trl-116): the subclass overrides two
methods and wraps a third, and tests/test_grpo_passes.py counts the forwards and FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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

        wrapped = self.__dict__.get("_get_per_token_logps_and_entropies")  # e.g. a counter's
        self._get_per_token_logps_and_entropies = with_ratio
        try:
            return super()._compute_loss(model, inputs)
        finally:
            if wrapped is None:
                del self._get_per_token_logps_and_entropies
            else:
                self._get_per_token_logps_and_entropies = wrapped

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
        parts = []
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            first, keep = trimmed(attention_mask[rows], logits_to_keep)
            ids = input_ids[rows, first : input_ids.size(1) - logits_to_keep + keep]
            mask = attention_mask[rows, first : input_ids.size(1) - logits_to_keep + keep]
            packed = pack_groups(ids, mask, keep, self.mask_dtype(model)) if share else None
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
        the recipe asks for it (``share_group_prompts``), the attention takes a 4-D mask (SDPA
        or eager) and no MoE load-balancing loss is asked for."""
        config = self.accelerator.unwrap_model(model).config
        return (
            getattr(self.args, "share_group_prompts", False)
            and config._attn_implementation in MASKED_ATTENTION
            and not kwargs.get("compute_aux_loss")
        )

    def mask_dtype(self, model) -> torch.dtype | None:
        """A boolean 4-D mask for SDPA; an additive one in the model's dtype for eager."""
        unwrapped = self.accelerator.unwrap_model(model)
        if unwrapped.config._attn_implementation == "sdpa":
            return None
        return unwrapped.get_input_embeddings().weight.dtype

    def packed_logps(self, model, packed: Packed, compute_entropy: bool | None):
        """TRL's fused head over a packed chunk (:func:`pack_groups`), each completion's
        log-probabilities (and entropies) put back in its row and column."""
        with self.accelerator.autocast():
            outputs = model(
                input_ids=packed.input_ids,
                attention_mask=packed.attention_mask,
                position_ids=packed.position_ids,
                shift_labels=packed.shift_labels,
                fused_lm_head=True,
            )
        logps = packed.unpack(outputs.log_probs)
        entropies = packed.unpack(outputs.entropy) if compute_entropy else None
        return logps, entropies, None


MASKED_ATTENTION = ("sdpa", "eager")


@dataclass
class Packed:
    """A chunk packed by :func:`pack_groups`: one row per group of completions that share a
    prompt; ``rows``/``columns`` say where each scored token of ``shift_labels`` goes in the
    chunk's (rows x kept completion columns) layout, read at ``groups``/``positions``."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    shift_labels: torch.Tensor
    shape: tuple[int, int]
    tokens: int  # what a forward reads, the packed rows' padding excluded
    rows: torch.Tensor
    columns: torch.Tensor
    groups: torch.Tensor
    positions: torch.Tensor

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """Per-token values of the packed rows in the chunk's layout (0 where nothing was
        scored, as TRL's fused head leaves padding)."""
        out = values.new_zeros(self.shape)
        return out.index_put((self.rows, self.columns), values[self.groups, self.positions])


def pack_groups(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: int, mask_dtype=None
) -> Packed | None:
    """Pack a chunk (rows of left-padded prompt, then `keep` right-padded completion columns)
    so each run of consecutive rows with the same prompt reads it once: the prompt but its last
    token, then per row its last prompt token and its completion but the last token (the
    positions that predict the completion's tokens), positions continuing from the prompt's.
    Each completion attends to the shared prompt and to itself. None when no two consecutive
    rows share a prompt, or a completion's mask is not a prefix (nothing to gain, or a layout
    this packing does not know).

    `mask_dtype`: None for a boolean mask (True: attend; SDPA), else an additive mask of that
    dtype (eager attention).
    """
    device = input_ids.device  # packed on the CPU (a few thousand ids), then moved
    input_ids, attention_mask = input_ids.cpu(), attention_mask.cpu()
    prompt_width = input_ids.size(1) - keep
    prompts, prompt_masks = input_ids[:, :prompt_width], attention_mask[:, :prompt_width]
    starts = [0] + [
        r
        for r in range(1, input_ids.size(0))
        if not (
            torch.equal(prompts[r], prompts[r - 1])
            and torch.equal(prompt_masks[r], prompt_masks[r - 1])
        )
    ]
    if len(starts) == input_ids.size(0):
        return None
    lengths = attention_mask[:, prompt_width:].sum(dim=1)
    completion = attention_mask[:, prompt_width:].bool()
    prefix = torch.arange(keep)[None] < lengths[:, None]
    if not torch.equal(completion, prefix):
        return None
    sequences, where = [], ([], [], [], [])
    ends = starts[1:] + [input_ids.size(0)]
    for group, (first, end) in enumerate(zip(starts, ends, strict=True)):
        prompt = prompts[first][prompt_masks[first].bool()]
        if prompt.numel() == 0 or int(lengths[first:end].sum()) == 0:
            return None
        tokens, positions, segments = [prompt[:-1]], [torch.arange(prompt.numel() - 1)], [0]
        segment_of = [torch.zeros(prompt.numel() - 1, dtype=torch.long)]
        labels = [torch.full((prompt.numel() - 1,), -100, dtype=input_ids.dtype)]
        at = prompt.numel() - 1
        for row in range(first, end):
            n = int(lengths[row])
            if n == 0:
                continue
            reply = input_ids[row, prompt_width : prompt_width + n]
            tokens.append(torch.cat([prompt[-1:], reply[:-1]]))
            positions.append(torch.arange(prompt.numel() - 1, prompt.numel() - 1 + n))
            segments.append(segments[-1] + 1)
            segment_of.append(torch.full((n,), segments[-1], dtype=torch.long))
            labels.append(reply)
            where[0].append(torch.full((n,), row))
            where[1].append(torch.arange(n))
            where[2].append(torch.full((n,), group))
            where[3].append(torch.arange(at, at + n))
            at += n
        sequences.append(
            (torch.cat(tokens), torch.cat(positions), torch.cat(segment_of), torch.cat(labels))
        )
    width = max(s[0].numel() for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=input_ids.dtype)
    position_ids = torch.full((len(sequences), width), -1, dtype=torch.long)
    shift_labels = torch.full((len(sequences), width), -100, dtype=input_ids.dtype)
    segment = torch.full((len(sequences), width), -1, dtype=torch.long)
    for g, (tokens, positions, segment_of, labels) in enumerate(sequences):
        n = tokens.numel()
        ids[g, :n], position_ids[g, :n] = tokens, positions
        segment[g, :n], shift_labels[g, :n] = segment_of, labels.to(input_ids.dtype)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    query, key = segment[:, :, None], segment[:, None, :]
    allowed = causal & (key >= 0) & ((key == 0) | (key == query))
    allowed |= torch.eye(width, dtype=torch.bool)  # a padding query attends to itself (no NaN)
    mask = allowed[:, None]
    if mask_dtype is not None:
        mask = torch.zeros(mask.shape, dtype=mask_dtype).masked_fill(
            ~mask, torch.finfo(mask_dtype).min
        )
    return Packed(
        input_ids=ids.to(device),
        position_ids=position_ids.clamp(min=0).to(device),
        attention_mask=mask.to(device),
        shift_labels=shift_labels.to(device),
        shape=(input_ids.size(0), keep),
        tokens=sum(s[0].numel() for s in sequences),
        rows=torch.cat(where[0]).to(device),
        columns=torch.cat(where[1]).to(device),
        groups=torch.cat(where[2]).to(device),
        positions=torch.cat(where[3]).to(device),
    )


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
