"""The benchmark's vLLM engine: the GPUs it spreads a model over (a choice vLLM 0.31.0 accepts,
one GPU wherever the model fits) and its explicit shutdown.

The Qwen2.5 configs are the published ones (config.json on the Hub), with the parameter counts
their model cards give; the rule checker restates vLLM 0.31.0's own asserts and ValueErrors on
its own, so a rule :func:`vllm_splits` missed would show here.
"""

from __future__ import annotations

import contextlib
import sys
from types import SimpleNamespace

import pytest
from transformers import Qwen2Config

from grail.core.errors import GrailError
from grail.inference.local import vllm_engine
from grail.inference.tensor_parallel import (
    GIB,
    WEIGHT_BYTES,
    model_shape,
    tensor_parallel_size,
    vllm_splits,
    weight_bytes,
)

QWEN = {  # name: (config.json, parameters per the model card)
    "0.5B": (
        dict(
            hidden_size=896,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            intermediate_size=4864,
            vocab_size=151936,
            tie_word_embeddings=True,
        ),
        0.49e9,
    ),
    "1.5B": (
        dict(
            hidden_size=1536,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            intermediate_size=8960,
            vocab_size=151936,
            tie_word_embeddings=True,
        ),
        1.54e9,
    ),
    "3B": (
        dict(
            hidden_size=2048,
            num_hidden_layers=36,
            num_attention_heads=16,
            num_key_value_heads=2,
            intermediate_size=11008,
            vocab_size=151936,
            tie_word_embeddings=True,
        ),
        3.09e9,
    ),
    "7B": (
        dict(
            hidden_size=3584,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            intermediate_size=18944,
            vocab_size=152064,
            tie_word_embeddings=False,
        ),
        7.62e9,
    ),
}
GPU_MEMORY = [16 * GIB, 24 * GIB, 40 * GIB, 80 * GIB]


def config(name: str) -> Qwen2Config:
    return Qwen2Config(**QWEN[name][0])


def vllm_refusals(config: Qwen2Config, tp: int) -> list[str]:
    """What vLLM 0.31.0 raises or asserts when it loads `config` over `tp` GPUs."""
    refusals = []
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % tp:  # vllm/config/model.py, ModelConfig.verify_with_parallel_config
        refusals.append(f"{heads} attention heads over {tp}")
    # vllm/model_executor/layers/linear.py, QKVParallelLinear.__init__: divide(tp, kv_heads)
    # when tp >= kv_heads (each KV head replicated), else divide(kv_heads, tp)
    if (tp % kv_heads if tp >= kv_heads else kv_heads % tp) != 0:
        refusals.append(f"{kv_heads} KV heads over {tp}")
    # MergedColumnParallelLinear.__init__ (gate_up_proj), RowParallelLinear.__init__ (down_proj)
    if config.intermediate_size % tp:
        refusals.append(f"intermediate size {config.intermediate_size} over {tp}")
    # vocab_parallel_embedding.py, VocabParallelEmbedding.__init__: pad_vocab_size(vocab, 64),
    # then divide(padded, tp)
    padded = (config.vocab_size + 63) // 64 * 64
    if padded % tp:
        refusals.append(f"padded vocabulary {padded} over {tp}")
    return refusals


def fits(name: str, tp: int, gpu_memory: int) -> bool:
    """Half a GPU holds the model's share of its 16-bit weights (the model card's count)."""
    return QWEN[name][1] * WEIGHT_BYTES / tp <= gpu_memory / 2


@pytest.mark.parametrize("name", QWEN)
def test_the_weights_are_counted_as_the_model_cards_count_them(name):
    assert weight_bytes(model_shape(config(name))) / WEIGHT_BYTES == pytest.approx(
        QWEN[name][1], rel=0.01
    )


@pytest.mark.parametrize("name", QWEN)
def test_a_config_object_and_its_config_json_give_the_same_shape(name):
    assert model_shape(config(name)) == model_shape(config(name).to_dict())
    assert model_shape(config(name)) == model_shape(QWEN[name][0])


# Made-up shapes where one rule alone refuses a 3-way split (Qwen2.5's heads and MLP sizes
# refuse every odd split themselves, so they do not show the other rules).
ONE_RULE_REFUSES = {
    "KV heads": dict(num_attention_heads=24, num_key_value_heads=4),
    "intermediate size": dict(
        num_attention_heads=24, num_key_value_heads=24, intermediate_size=8960
    ),
    "padded vocabulary": dict(num_attention_heads=24, num_key_value_heads=24, vocab_size=151936),
    "attention heads": dict(num_attention_heads=20, num_key_value_heads=1),
}


@pytest.mark.parametrize("rule", ONE_RULE_REFUSES)
def test_each_of_vllms_rules_is_kept(rule):
    shape = dict(QWEN["7B"][0], intermediate_size=12288) | ONE_RULE_REFUSES[rule]
    made_up = Qwen2Config(**shape)
    assert [rule in refusal for refusal in vllm_refusals(made_up, 3)] == [True]
    for tp in range(1, 9):
        assert vllm_splits(model_shape(made_up), tp) == (not vllm_refusals(made_up, tp)), tp


@pytest.mark.parametrize("name", QWEN)
@pytest.mark.parametrize("gpu_memory", GPU_MEMORY)
def test_every_choice_is_one_vllm_accepts_and_the_fewest_gpus_that_hold_the_model(name, gpu_memory):
    for gpus in range(1, 9):
        accepted = [tp for tp in range(1, gpus + 1) if not vllm_refusals(config(name), tp)]
        holding = [tp for tp in accepted if fits(name, tp, gpu_memory)]
        if not holding:
            with pytest.raises(GrailError):
                tensor_parallel_size(config(name), gpus, gpu_memory)
            continue
        tp = tensor_parallel_size(config(name), gpus, gpu_memory)
        assert vllm_refusals(config(name), tp) == [], (name, gpus, tp)
        assert tp == holding[0], (name, gpus, gpu_memory / GIB)


def test_qwen_1_5b_on_eight_80_gb_gpus_takes_one():
    assert tensor_parallel_size(config("1.5B"), 8, 80 * GIB) == 1


def test_qwen_1_5b_is_never_split_three_or_six_ways():
    assert vllm_refusals(config("1.5B"), 3) and vllm_refusals(config("1.5B"), 6)
    chosen = set()
    for gpus in range(1, 9):
        for gib in (1, 2, 3, 4, 6, 8, 16, 80):
            with contextlib.suppress(GrailError):  # too small for any split
                chosen.add(tensor_parallel_size(config("1.5B"), gpus, gib * GIB))
    assert chosen == {1, 2, 4}  # small GPUs did make it split: never 3 or 6 ways


def test_a_model_too_big_for_one_gpu_is_split_as_vllm_accepts():
    tp = tensor_parallel_size(config("7B"), 8, 16 * GIB)
    assert tp == 2 and vllm_refusals(config("7B"), tp) == []


def test_a_model_no_split_holds_is_one_line_naming_what_would():
    with pytest.raises(GrailError) as error:
        tensor_parallel_size(config("7B"), 1, 16 * GIB)
    message = str(error.value)
    assert "\n" not in message
    assert "14.2 GiB of weights" in message and "on 1 GPU(s) (1)" in message
    assert "more GPUs or larger ones" in message


def test_the_engine_is_shut_down_on_exit_even_when_the_benchmark_fails(monkeypatch):
    """vLLM 0.31.0's LLM has no shutdown: its engine client's (llm_engine.engine_core) is called
    (a fake vllm; the vLLM tier runs the real one on its CPU build)."""
    shutdowns = []

    class FakeLLM:
        def __init__(self, **settings):
            self.settings = settings
            client = SimpleNamespace(shutdown=lambda: shutdowns.append(settings["model"]))
            self.llm_engine = SimpleNamespace(engine_core=client)

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(LLM=FakeLLM))
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)
    with vllm_engine("tiny") as engine:
        assert engine.settings["tensor_parallel_size"] == 1  # vLLM's CPU build
    with pytest.raises(RuntimeError), vllm_engine("tiny-2"):
        raise RuntimeError("the benchmark failed")
    assert shutdowns == ["tiny", "tiny-2"]
