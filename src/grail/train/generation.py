"""The policy's ``generate`` during training without vLLM, as TRL calls it
(``unwrapped_model.generate(input_ids=..., attention_mask=..., generation_config=...)``), made
cheaper; :func:`training_generate` chooses which, if any, training puts on the model:

- :class:`SharedPrefill` (``share_group_prompts``): TRL repeats each prompt once per completion
  of its group (8 in the 1.5B recipes) and transformers prefills every copy. Each distinct
  prompt is prefilled once instead, and its KV cache copied to its group's rows before
  decoding (transformers' cache continuation: ``generate`` given a cache runs only the tokens
  the cache lacks);
- :class:`ReusedStaticCache` (``compile_generation``): the static KV cache kept across calls,
  so the compiled decoding step's CUDA graphs are recorded once; each distinct prompt
  prefilled once there too.

Both hold keys and values in the dtype attention reads them in (:class:`AttentionDtype`): under
bf16 autocast over fp32 weights, transformers' own caches hold them in fp32, twice the bytes
every decoding step reads, and its static cache cannot take them at all.

Neither changes what is generated (tests/test_grpo_passes.py; a shared prefill's logits are
the same up to rounding: its batches have other shapes); any other call goes to the model's own
``generate``.
"""

from __future__ import annotations

import copy

import torch
from peft import PeftModel
from transformers import DynamicCache, StaticCache

TRL_INPUTS = {"input_ids", "attention_mask"}  # what TRL 1.16 passes for a text-only model


def training_generate(model, config):
    """The ``generate`` put on the trained model, or None for its own: none under vLLM (TRL
    calls the engine), the kept static cache with ``compile_generation``, else each distinct
    prompt prefilled once with ``share_group_prompts``."""
    if config.use_vllm:
        return None
    if config.compile_generation:
        return ReusedStaticCache(model, share_prompts=config.share_group_prompts)
    return SharedPrefill(model) if config.share_group_prompts else None


class SharedPrefill:
    """The model's ``generate``, with each distinct prompt of a batch prefilled once.

    The prompt's tokens but the last run through the model once per distinct prompt
    (:func:`shared_prefill`); the KV cache is copied to every row holding that prompt, and
    ``generate`` goes on from it: its first forward reads each row's last prompt token, then
    it decodes as it would have. A cache implementation named in the config, beams, several
    sequences per prompt or inputs other than TRL's go to ``generate`` as they came.
    """

    def __init__(self, model):
        self.model = model

    def __call__(self, *args, generation_config=None, **kwargs):
        model, config, shared = self.model, generation_config, None
        if not args and config is not None and config.cache_implementation is None:
            shared = shared_prefill(model, config, kwargs)
        if shared is None:
            return type(model).generate(model, *args, generation_config=config, **kwargs)
        cache, rows = shared
        cache.batch_select_indices(rows)
        return type(model).generate(
            model, generation_config=config, past_key_values=cache, **kwargs
        )


def shared_prefill(model, generation_config, inputs: dict):
    """The KV cache of each distinct prompt of ``inputs`` (TRL's ``input_ids`` and
    ``attention_mask``, rows compared whole) but its last token, and for every row the index
    of its prompt in that cache; None where the generation cannot go on from a prefilled
    cache copied to each row (an encoder-decoder, beams, several sequences per prompt, a
    chunked prefill, no cache, other inputs, one-token prompts)."""
    config = generation_config
    if not (
        set(inputs) == TRL_INPUTS
        and config.use_cache is not False  # None: transformers' default, a cache
        and (config.num_beams or 1) == 1
        and (config.num_return_sequences or 1) == 1
        and config.prefill_chunk_size is None
        and not model.config.is_encoder_decoder
    ):
        return None
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    groups = prompt_rows(ids, mask)
    if groups is None:
        return None
    firsts, rows = groups
    return prefill(model, ids[firsts, :-1], mask[firsts, :-1]), rows


def prompt_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The first row of each distinct prompt (ids and mask compared whole), and for every row
    the index of its prompt among those; None when prompts have a single column (nothing
    before the last token to prefill). A batch with no repeated prompt is prefilled too (one
    forward more, of one token a row): every process of a ZeRO-3 run then runs the same
    forwards, whose layers gather their weights collectively when generation does not gather
    them first (``ds3_gather_for_generation: false``).

    >>> prompt_rows(torch.tensor([[5, 6], [7, 8], [5, 6]]), torch.ones(3, 2, dtype=torch.long))
    (tensor([0, 1]), tensor([0, 1, 0]))
    """
    if ids.size(1) < 2:
        return None
    distinct, rows = torch.unique(torch.cat([ids, mask], 1), dim=0, return_inverse=True)
    order = torch.arange(ids.size(0), device=ids.device)
    firsts = torch.full((distinct.size(0),), ids.size(0), device=ids.device)
    return firsts.scatter_reduce(0, rows, order, "amin"), rows


def prefill(model, ids: torch.Tensor, mask: torch.Tensor):
    """The KV cache of ``ids`` at the positions ``generate`` gives left-padded rows (the
    attention mask's running count; padding at 0), scoring only the last position."""
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    kept = {"logits_to_keep": 1} if base._supports_logits_to_keep() else {}
    cache = AttentionDtypeDynamicCache(config=model.config)
    with torch.no_grad():
        outputs = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **kept,
        )
    return outputs.past_key_values


class AttentionDtype:
    """A KV cache that holds keys and values in the values' dtype, the one attention reads
    them in. Under bf16 autocast over fp32 weights (grail's training on a GPU), the key and
    value projections come out in bf16, but RoPE's fp32 cos and sin turn the keys to fp32;
    transformers' caches allocate both in the keys' dtype. So its dynamic cache holds the
    values in fp32 too (twice the bytes, read again by every decoding step, and cast back to
    bf16 by autocast at each attention call), and its static cache refuses the bf16 values
    (``index_copy_``: "expected to have the same dtype"). Autocast casts attention's inputs
    to bf16 anyway (SDPA and matmul are on its lower-precision list; grail's ``sdpa_flex``
    casts them itself), so keys cast before they are stored give the same attention. Without
    autocast, keys and values share a dtype and nothing is cast."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys = key_states.to(value_states.dtype)
        return super().update(keys, value_states, layer_idx, *args, **kwargs)


class AttentionDtypeDynamicCache(AttentionDtype, DynamicCache):
    """transformers' dynamic cache, in attention's dtype (:class:`AttentionDtype`)."""


class AttentionDtypeStaticCache(AttentionDtype, StaticCache):
    """transformers' static cache, in attention's dtype (:class:`AttentionDtype`)."""


class ReusedStaticCache:
    """``compile_generation``: the model's ``generate`` with its static KV cache kept across
    calls and reset before each. transformers builds a new cache at every call, so its tensors
    move, and a CUDA graph (transformers' compiled decoding step runs in them) holds its
    inputs' addresses: torch's cudagraph trees would record the decoding step again at every
    generation. One cache at a time (the memory estimate counts one): a batch of another size,
    or one that needs more positions than it holds, gets a new one, as transformers sizes its
    own (at least the config's ``max_cache_len``). With ``share_prompts``
    (``share_group_prompts``) each distinct prompt is prefilled once (:func:`shared_prefill`)
    and written to each of its rows of the cache in place, as :class:`SharedPrefill` does."""

    def __init__(self, model, share_prompts: bool = False):
        self.model, self.cache, self.rows = model, None, 0
        self.share_prompts = share_prompts

    def __call__(self, *args, generation_config=None, **kwargs):
        model, ids = self.model, kwargs.get("input_ids")
        if (
            generation_config is None
            or generation_config.cache_implementation != "static"
            or kwargs.get("past_key_values") is not None
            or ids is None
            or args
        ):
            return type(model).generate(model, *args, generation_config=generation_config, **kwargs)
        config = copy.deepcopy(generation_config)
        copies = max(config.num_return_sequences or 1, config.num_beams or 1)
        rows = ids.size(0) * copies
        new_tokens = config.max_new_tokens or config.max_length - ids.size(1)
        positions = max(ids.size(1) + new_tokens - 1, config.max_cache_len or 0)
        if self.cache is None or self.rows != rows or self.cache.get_max_length() < positions:
            self.cache = AttentionDtypeStaticCache(  # its tensors are allocated at first use
                config=model.config.get_text_config(decoder=True), max_cache_len=positions
            )
            self.rows = rows
        # a sliding layer's prefill keeps its window alone: every row prefilled by generate
        share = self.share_prompts and not any(self.cache.is_sliding)
        shared = share and shared_prefill(model, generation_config, kwargs)
        self.cache.reset()
        if shared:
            prefilled, rows = shared  # each row's prompt written in place: the same addresses
            for index, layer in enumerate(prefilled.layers):
                self.cache.update(layer.keys[rows], layer.values[rows], index)
        # transformers refuses a cache implementation beside a given cache
        config.cache_implementation = config.max_cache_len = None
        return type(model).generate(
            model, *args, generation_config=config, past_key_values=self.cache, **kwargs
        )
