"""``attn_implementation: sdpa_flex``: SDPA for ordinary rows, FlexAttention for packed groups.

A packed group (:func:`grail.train.grpo.pack_groups`) needs a mask in which each completion
sees the shared prompt and itself. SDPA takes it as a dense 4-D mask, which rules out its flash
kernel and scores every pair of the packed row, the pairs between two completions included
(most of a long group's square). FlexAttention takes it as a block mask and skips the blocks
nobody attends, so a packed row costs about the pairs it uses.

``sdpa_flex`` is registered with transformers' ``AttentionInterface`` (its documented way to
add an attention function): a forward given a FlexAttention ``BlockMask`` runs FlexAttention,
any other (generation, rows not worth packing) runs transformers' own SDPA function with
transformers' own SDPA mask. Chosen by the model, not per call, because gradient checkpointing
recomputes each layer's attention during the backward, outside any per-call switch; the mask
it is given decides.

Not transformers' own ``flex_attention``, which would also run generation and the rows that
are not worth packing through FlexAttention. FlexAttention is compiled with dynamic shapes from
its first call: a packed row's width changes every chunk. torch 2.13 has no FlexAttention
backward on CPU (docs/pins.md#torch-213): packed forwards without gradients run there (the
tests), training packed groups needs a GPU.
"""

from __future__ import annotations

import functools

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from grail.core.errors import GrailError

SDPA_FLEX = "sdpa_flex"


@functools.cache
def compiled_flex_attention():
    """torch's FlexAttention compiled once for every shape (``dynamic=True``)."""
    return torch.compile(flex_attention, dynamic=True)


def sdpa_flex_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: FlexAttention for a ``BlockMask``, else
    transformers' SDPA function unchanged."""
    if not isinstance(attention_mask, BlockMask):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if dropout:
        raise GrailError(f"attn_implementation {SDPA_FLEX}: a packed forward has no dropout")
    device = query.device.type
    if torch.is_autocast_enabled(device):  # as autocast casts SDPA's inputs (q, k: fp32 after
        dtype = torch.get_autocast_dtype(device)  # RoPE on an fp32 residual stream; v: bf16)
        query, key, value = (t.to(dtype) for t in (query, key, value))
    output = compiled_flex_attention()(
        query,
        key,
        value,
        block_mask=attention_mask,
        scale=scaling,
        enable_gqa=query.size(1) != key.size(1),
        # the main kernel (a packed row is a long prefill): the decoding kernel torch may pick
        # for short queries needs a power-of-2 number of query heads per key/value head (6 in
        # Qwen2.5-1.5B)
        kernel_options={"FORCE_USE_FLEX_ATTENTION": True},
    )
    return output.transpose(1, 2).contiguous(), None


def segment_block_mask(segment: torch.Tensor) -> BlockMask:
    """The block mask of packed rows whose tokens are in `segment` (0: the prompt, k: the
    k-th completion, -1: padding), the rule of :func:`grail.train.grpo.segment_mask`: causal,
    each completion seeing the prompt and itself, a padding query itself alone."""

    def allowed(batch, head, query, key):
        seen, asking = segment[batch, key], segment[batch, query]
        shared = (seen >= 0) & ((seen == 0) | (seen == asking))
        return ((key <= query) & shared) | (key == query)

    rows, width = segment.shape
    return create_block_mask(allowed, rows, None, width, width, device=segment.device)


def check_trainable(attn_implementation: str | None, share_group_prompts: bool, cpu: bool) -> None:
    """One clear line where a GRPO run would pack groups under ``sdpa_flex`` with no GPU to
    train on: torch has no FlexAttention backward on CPU."""
    if attn_implementation == SDPA_FLEX and share_group_prompts and cpu:
        raise GrailError(
            f"attn_implementation {SDPA_FLEX}: training packed groups needs a CUDA GPU (torch "
            "has no FlexAttention backward on CPU); use sdpa, or share_group_prompts: false"
        )


AttentionInterface.register(SDPA_FLEX, sdpa_flex_attention)
AttentionMaskInterface.register(SDPA_FLEX, sdpa_mask)
