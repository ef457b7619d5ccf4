"""Whether one GPU needs gradient checkpointing: a memory estimate of a GRPO step, printed at
the start of training (``gradient_checkpointing_by_memory``, on by default).

Checkpointing recomputes every layer's forward in the backward pass (about a third more FLOPs
per trained token); it is worth paying only when the activations would not fit. The estimate,
for one process with grail's fp32 master weights under bf16 autocast:

- 16 bytes per trained parameter (fp32 weights and gradients, Adam's two moments) and 2 for
  autocast's cache of their bf16 casts;
- the reference model: 2 bytes per parameter (bf16 linears, grail.train.grpo) when ``beta > 0``;
- vLLM's share of the GPU when it is colocated (``vllm_gpu_memory_utilization``), held beside
  the training's activations unless ``vllm_enable_sleep_mode`` frees it while training runs
  (then only the larger of the two counts);
- the larger of generation's KV cache (transformers' generate: the whole generation batch) and
  one micro-batch's activations. Activations: per token and layer, the fp32 residual stream and
  norm inputs plus the bf16 inputs of every projection (:func:`activation_bytes_per_token`);
  with checkpointing, only each layer's fp32 input and one layer's activations. The tokens are
  those the forward holds (:func:`micro_batch_tokens`): with ``share_group_prompts`` each group
  of a micro-batch reads its prompt once, in one row whose dense SDPA mask counts too.

What vLLM needs when colocated (:func:`vllm_bytes`: bf16 weights, one generation batch's KV
cache, ``VLLM_OVERHEAD``) gives the share a recipe should ask for (:func:`vllm_share`); the GPU
recipes set ``vllm_gpu_memory_utilization`` from it (tests/test_grpo_passes.py holds them to it).

Checkpointing goes on when the estimate without it passes ``HEADROOM`` of the GPU's memory.
The estimate is a model, not a measurement: ``make bench-gpu`` prints it beside the peak it
measured.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

logger = logging.getLogger(__name__)

GIB = 2**30
HEADROOM = 0.85  # the share of the GPU's memory the estimate may fill: the allocator's slack
STATE_BYTES = 16 + 2  # fp32 weight, gradient, Adam m and v; autocast's bf16 weight cache
REFERENCE_BYTES = 2  # the reference model's bf16 linears
# vLLM's memory beyond its weights and the KV cache it needs: its start-up profiling pass's
# activations, CUDA graphs, the sampler's logits and the allocator's slack (a model: vLLM reports
# its own split at start-up, "Available KV cache memory")
VLLM_OVERHEAD = 3 * GIB


@dataclass(frozen=True)
class Shape:
    """What the estimate needs of a decoder: parameters, layers, widths, KV heads."""

    parameters: int
    layers: int
    hidden: int
    intermediate: int
    kv_width: int  # key/value heads x head size


@dataclass(frozen=True)
class MemoryPlan:
    """The estimate, in bytes, and the choice it makes."""

    gpu: int
    states: int
    reference: int
    vllm: int
    generation: int
    vllm_sleeps: bool  # vllm_enable_sleep_mode: vLLM's memory is free while training runs
    activations_off: int  # one micro-batch without checkpointing
    activations_on: int

    def total(self, checkpointing: bool) -> int:
        activations = self.activations_on if checkpointing else self.activations_off
        if self.vllm_sleeps:  # generation and training never hold their memory at once
            return self.states + self.reference + max(self.vllm, self.generation, activations)
        return self.states + self.reference + self.vllm + max(self.generation, activations)

    @property
    def checkpointing(self) -> bool:
        return self.total(False) > HEADROOM * self.gpu

    def describe(self) -> str:
        def gib(n: int) -> str:
            return f"{n / GIB:.1f}"

        activations = (
            f"activations {gib(self.activations_off)} without checkpointing, "
            f"{gib(self.activations_on)} with"
        )
        return (
            f"memory estimate (GiB): states {gib(self.states)} + reference "
            f"{gib(self.reference)} + vLLM {gib(self.vllm)}"
            f"{' (asleep while training)' if self.vllm_sleeps else ''} + max(generation "
            f"{gib(self.generation)}, {activations}) = {gib(self.total(False))} "
            f"without, {gib(self.total(True))} with, of {gib(self.gpu)} on the GPU: "
            f"gradient_checkpointing {'on' if self.checkpointing else 'off'}"
        )


def activation_bytes_per_token(shape: Shape, checkpointing: bool) -> int:
    """Bytes one token's activations hold for the backward pass, all layers.

    Per layer under bf16 autocast with an fp32 residual stream: each of the two RMS norms'
    fp32 input and normalised output (16h), the bf16 input of each projection (q, k, v: 6h;
    o: 2h; gate, up: 4h), the query before and after RoPE and the attention output (6h), the
    keys and values before and after RoPE (8 x kv width), and the MLP's gate, up, activation
    and product (8i). With checkpointing: each layer's fp32 input (4h) and one layer in full.
    On an H100 (bench/gpu.py, Qwen2.5-1.5B's shape) the measured peaks were 8-9% above this
    estimate without checkpointing: HEADROOM leaves room for that.

    >>> activation_bytes_per_token(Shape(0, 2, 10, 20, 4), False)
    1064
    >>> activation_bytes_per_token(Shape(0, 2, 10, 20, 4), True)
    612
    """
    layer = 34 * shape.hidden + 8 * shape.kv_width + 8 * shape.intermediate
    if checkpointing:
        return 4 * shape.hidden * shape.layers + layer
    return layer * shape.layers


def micro_batch_tokens(config, prompt_tokens: int) -> tuple[int, int, int]:
    """(tokens one micro-batch's forward holds, its rows, the longest row's length). Unpacked,
    each completion's row carries the prompt; with ``share_group_prompts`` each group in the
    micro-batch (``num_generations`` completions, fewer when the micro-batch is smaller) is one
    row: the prompt once, then its completions (grail.train.grpo.pack_groups).

    >>> class C: per_device_train_batch_size, num_generations, max_completion_length = 16, 8, 256
    >>> C.share_group_prompts = False
    >>> micro_batch_tokens(C, 1000)
    (20096, 16, 1256)
    >>> C.share_group_prompts = True
    >>> micro_batch_tokens(C, 1000)
    (6096, 2, 3048)
    """
    rows, completion = config.per_device_train_batch_size, config.max_completion_length
    if not config.share_group_prompts:
        return rows * (prompt_tokens + completion), rows, prompt_tokens + completion
    per_group = max(min(config.num_generations, rows), 1)
    groups = math.ceil(rows / per_group)
    return (
        groups * prompt_tokens + rows * completion,
        groups,
        prompt_tokens + per_group * completion,
    )


def plan(shape: Shape, config, prompt_tokens: int, gpu_bytes: int) -> MemoryPlan:
    """The estimate for a recipe (``config``: the TrainConfig) whose longest prompt is
    ``prompt_tokens`` tokens, on a GPU of ``gpu_bytes``."""
    sequence = prompt_tokens + config.max_completion_length
    tokens, rows, longest = micro_batch_tokens(config, prompt_tokens)
    # a packed row's dense SDPA mask, as a bf16 additive bias (one layer's at a time)
    mask = 2 * rows * longest * longest if config.share_group_prompts else 0
    generation_rows = config.per_device_train_batch_size * config.steps_per_generation
    colocated = config.use_vllm and config.vllm_mode == "colocate"
    return MemoryPlan(
        gpu=gpu_bytes,
        states=STATE_BYTES * shape.parameters,
        reference=REFERENCE_BYTES * shape.parameters if config.beta else 0,
        vllm=int(config.vllm_gpu_memory_utilization * gpu_bytes) if colocated else 0,
        generation=0 if config.use_vllm else generation_rows * sequence * kv_bytes(shape),
        vllm_sleeps=bool(colocated and getattr(config, "vllm_enable_sleep_mode", False)),
        activations_off=tokens * activation_bytes_per_token(shape, False) + mask,
        activations_on=tokens * activation_bytes_per_token(shape, True) + mask,
    )


def vllm_bytes(shape: Shape, config, prompt_tokens: int) -> int:
    """What a colocated vLLM engine needs on one GPU: its bf16 weights, the KV cache of one
    generation batch (``per_device_train_batch_size`` x ``steps_per_generation`` sequences of
    the prompt and a whole completion) and :data:`VLLM_OVERHEAD`."""
    rows = config.per_device_train_batch_size * config.steps_per_generation
    cache = rows * (prompt_tokens + config.max_completion_length) * kv_bytes(shape)
    return 2 * shape.parameters + cache + VLLM_OVERHEAD


def vllm_share(shape: Shape, config, prompt_tokens: int, gpu_bytes: int) -> float:
    """The ``vllm_gpu_memory_utilization`` that holds :func:`vllm_bytes`, rounded up to a
    hundredth: more leaves the training less room for nothing (vLLM fills its share with KV
    cache whether one generation batch needs it or not)."""
    return math.ceil(100 * vllm_bytes(shape, config, prompt_tokens) / gpu_bytes) / 100


def kv_bytes(shape: Shape) -> int:
    """Bytes of bf16 keys and values one token holds in generation's cache, all layers."""
    return 2 * 2 * shape.kv_width * shape.layers


def model_shape(model_path: str) -> Shape:
    """The decoder's shape from its config, its parameters counted on the meta device (no
    weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path).get_text_config()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    heads = config.num_attention_heads
    head_size = getattr(config, "head_dim", None) or config.hidden_size // heads
    return Shape(
        parameters=sum(p.numel() for p in model.parameters()),
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        kv_width=getattr(config, "num_key_value_heads", heads) * head_size,
    )


def longest_prompt_tokens(model_path: str, prompts: list, sample: int = 32) -> int:
    """Tokens in the longest of the ``sample`` longest prompts (by characters), with the
    model's chat template when the prompts are conversations."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    longest = sorted(prompts, key=lambda p: len(str(p)), reverse=True)[:sample]
    counts = [  # transformers 5 returns a BatchEncoding from a tokenized chat template
        len(
            tokenizer.apply_chat_template(p, add_generation_prompt=True, return_dict=True)[
                "input_ids"
            ]
        )
        if isinstance(p, list)
        else len(tokenizer(p)["input_ids"])
        for p in longest
    ]
    return max(counts, default=0)


def choose_gradient_checkpointing(
    config, model_path: str, prompts: list, peft: bool = False
) -> MemoryPlan | None:
    """Set ``config.gradient_checkpointing`` from the estimate on a one-process, full
    fine-tuning CUDA run with ``gradient_checkpointing_by_memory``; logs the estimate. None
    where the recipe's value stands (the option is off, no CUDA device, DeepSpeed shards the
    states, or LoRA trains a few)."""
    import torch

    from grail.train.multigpu import deepspeed_active

    if not config.gradient_checkpointing_by_memory:
        return None
    why = (
        "no CUDA device"
        if not torch.cuda.is_available()
        else "DeepSpeed shards the states"
        if deepspeed_active(config)
        else "LoRA"
        if peft
        else None
    )
    if why:
        logger.info(
            "gradient_checkpointing %s as the recipe says (no memory estimate: %s)",
            "on" if config.gradient_checkpointing else "off",
            why,
        )
        return None
    gpu = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    longest = longest_prompt_tokens(model_path, prompts)
    estimate = plan(model_shape(model_path), config, longest, gpu)
    config.gradient_checkpointing = estimate.checkpointing
    logger.info("%s", estimate.describe())
    return estimate
