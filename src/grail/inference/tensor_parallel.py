"""How many GPUs vLLM's offline engine spreads a benchmarked model over: the fewest that vLLM
0.31.0 can split the model over and that hold its 16-bit weights comfortably, so one GPU
wherever the model fits on one (:func:`tensor_parallel_size`, pure; the machine's GPUs in
:func:`engine_tensor_parallel_size`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grail.core.errors import GrailError

if TYPE_CHECKING:
    from transformers import PretrainedConfig


GIB = 2**30


# vLLM loads weights 16-bit (dtype "auto": bf16 for a bf16 checkpoint, fp16 for an fp32 one,
# vllm/config/model.py ModelConfig.dtype): 2 bytes a parameter.
WEIGHT_BYTES = 2


# The share of a GPU's memory a model's weights may take and still fit comfortably: vLLM gives
# what it may use beyond them (gpu_memory_utilization, 0.92) to the KV cache, activations and CUDA
# graphs, and a KV cache of a few GiB is what keeps a benchmark's batches large.
WEIGHTS_SHARE = 0.5


VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE (vocab_parallel_embedding.py)


@dataclass(frozen=True)
class ModelShape:
    """What of a model's config decides how vLLM may split it over GPUs, and its weights' size."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool  # the output layer shares the input embeddings' weights


def model_shape(config: PretrainedConfig | Mapping) -> ModelShape:
    """A model's shape from its config (a transformers ``PretrainedConfig`` or its
    ``config.json`` as a dict), read as vLLM reads it: no KV-head count means one KV head per
    attention head, no head size means hidden / heads (vLLM 0.31.0's
    vllm/transformers_utils/model_arch_config_convertor.py, ModelArchConfigConvertorBase's
    get_total_num_kv_heads and get_head_size).

    >>> shape = model_shape({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    ...     "intermediate_size": 128, "vocab_size": 100})
    >>> shape.kv_heads, shape.head_dim, shape.tied
    (4, 16, False)
    """
    fields = config if isinstance(config, Mapping) else config.to_dict()
    heads = fields["num_attention_heads"]
    return ModelShape(
        hidden=fields["hidden_size"],
        layers=fields["num_hidden_layers"],
        heads=heads,
        kv_heads=fields.get("num_key_value_heads") or heads,
        head_dim=fields.get("head_dim") or fields["hidden_size"] // heads,
        intermediate=fields["intermediate_size"],
        vocab=fields["vocab_size"],
        tied=fields.get("tie_word_embeddings", False),
    )


def weight_bytes(shape: ModelShape) -> int:
    """The bytes of a model's weights as vLLM loads them: the embeddings (twice when the output
    layer has its own), and per layer the attention and MLP projections; norms and biases (under
    0.1%) are left out.

    >>> qwen_1_5b = ModelShape(1536, 28, 12, 2, 128, 8960, 151936, tied=True)
    >>> round(weight_bytes(qwen_1_5b) / WEIGHT_BYTES / 1e9, 2)  # Qwen2.5-1.5B: 1.54 B parameters
    1.54
    """
    embeddings = shape.vocab * shape.hidden * (1 if shape.tied else 2)
    attention = shape.hidden * shape.head_dim * 2 * (shape.heads + shape.kv_heads)  # q, k, v, o
    mlp = 3 * shape.hidden * shape.intermediate  # gate, up, down
    return WEIGHT_BYTES * (embeddings + shape.layers * (attention + mlp))


def vllm_splits(shape: ModelShape, tp: int) -> bool:
    """Whether vLLM 0.31.0 can split the model over `tp` GPUs (tensor parallelism).

    >>> qwen_1_5b = ModelShape(1536, 28, 12, 2, 128, 8960, 151936, tied=True)
    >>> [tp for tp in range(1, 9) if vllm_splits(qwen_1_5b, tp)]
    [1, 2, 4]
    """
    # Each rule is an assert or a ValueError in vLLM 0.31.0 when broken:
    # - attention heads: ModelConfig.verify_with_parallel_config (vllm/config/model.py);
    # - KV heads, vllm/model_executor/layers/linear.py QKVParallelLinear.__init__: split when
    #   there are more than tp of them, else each replicated on tp / kv_heads GPUs, so either
    #   count divides the other (Qwen2Attention.__init__, models/qwen2.py, asserts the same);
    # - the MLP's intermediate size: MergedColumnParallelLinear.__init__ asserts it divides
    #   (gate_up_proj), RowParallelLinear.__init__ divides it (down_proj);
    # - the vocabulary: VocabParallelEmbedding.__init__ (layers/vocab_parallel_embedding.py)
    #   pads it to a multiple of 64, not of tp, then divides the padded size by tp.
    kv_heads_split = (shape.kv_heads % tp if tp <= shape.kv_heads else tp % shape.kv_heads) == 0
    padded_vocab = -(-shape.vocab // VOCAB_PADDING) * VOCAB_PADDING
    return (
        shape.heads % tp == 0
        and kv_heads_split
        and shape.intermediate % tp == 0
        and padded_vocab % tp == 0
    )


def tensor_parallel_size(config: PretrainedConfig | Mapping, gpus: int, gpu_memory: int) -> int:
    """The GPUs vLLM's engine spreads the model over: the fewest of `gpus` (of `gpu_memory`
    bytes each) that vLLM can split it over (:func:`vllm_splits`) and that hold its 16-bit
    weights within `WEIGHTS_SHARE` of each GPU. So one GPU wherever the model fits on one, as
    Qwen2.5-1.5B does on any GPU it trains on: more would add an all-reduce after every
    layer's attention and MLP, and a process per GPU to start, for memory it does not need.

    Args:
        config: the model's config (a transformers ``PretrainedConfig``, or ``config.json``'s
            dict).
        gpus: the GPUs visible to the engine.
        gpu_memory: the memory of one of them, in bytes.

    Returns:
        vLLM's ``tensor_parallel_size``; a :class:`GrailError` when no size fits.

    >>> qwen_1_5b = {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
    ...     "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936,
    ...     "tie_word_embeddings": True}
    >>> tensor_parallel_size(qwen_1_5b, gpus=8, gpu_memory=80 * GIB)
    1
    >>> tensor_parallel_size(qwen_1_5b, gpus=8, gpu_memory=2 * GIB)  # 3 would hold it; no split
    4
    >>> tensor_parallel_size(qwen_1_5b, gpus=3, gpu_memory=2 * GIB)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    grail.core.errors.GrailError: the model's 2.9 GiB of weights fit in none of ...
    """
    shape = model_shape(config)
    weights = weight_bytes(shape)
    splits = [tp for tp in range(1, gpus + 1) if vllm_splits(shape, tp)]
    for tp in splits:
        if weights / tp <= WEIGHTS_SHARE * gpu_memory:
            return tp
    raise GrailError(
        f"the model's {weights / GIB:.1f} GiB of weights fit in none of the tensor-parallel "
        f"sizes vLLM can split it over on {gpus} GPU(s) ({', '.join(map(str, splits))}), each "
        f"GPU of {gpu_memory / GIB:.0f} GiB holding {WEIGHTS_SHARE:.0%} in weights: "
        "give the benchmark more GPUs or larger ones"
    )


def engine_tensor_parallel_size(path: str) -> int:
    """:func:`tensor_parallel_size` for the model at `path` on this machine's visible GPUs
    (the smallest one's memory); 1 on vLLM's CPU build."""
    import torch
    from transformers import AutoConfig

    gpus = torch.cuda.device_count()
    if not gpus:
        return 1
    memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(gpus))
    return tensor_parallel_size(AutoConfig.from_pretrained(path), gpus, memory)
