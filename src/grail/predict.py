"""Model answers for the benchmark: local models and checkpoints in-process, or any
OpenAI-compatible endpoint.

Model specs (``grail benchmark --model SPEC``):

- a model folder (``config.json`` inside): evaluated in-process, greedy: with vLLM's offline
  ``LLM`` (tensor-parallel over the pod's GPUs) where a GPU and vLLM are present (the training
  image on the GPU pool), else with transformers, batched (``--backend`` forces one);
- a training output folder (``checkpoint-N`` folders inside) or a ``checkpoint_uri``
  (``s3://...``, ``file://...``): every checkpoint, giving accuracy per training step, plus the
  final model when the folder holds one;
- ``openai:NAME@URL``: an OpenAI-compatible server (``vllm serve``, ``transformers serve``) at URL;
- ``openai:NAME``: the OpenAI API itself, when ``OPENAI_API_KEY`` is set.

Remote calls use the ``openai`` client's own retries with exponential backoff, a concurrency
limit, and temperature 0. A dry run prints what would be sent and sends nothing.
"""

from __future__ import annotations

import json
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from grail.errors import GrailError
from grail.progress import Progress

logger = logging.getLogger(__name__)
STEP = re.compile(r"checkpoint-(\d+)$")


@dataclass(frozen=True)
class ModelSpec:
    """One model to evaluate."""

    name: str
    kind: str  # "local" or "openai"
    path: str | None = None  # local folder
    model: str | None = None  # remote model name
    base_url: str | None = None  # None: the OpenAI API
    step: int | None = None  # training step, for checkpoints
    series: str | None = None  # the training run a checkpoint belongs to


def _local_specs(folder: Path, label: str) -> list[ModelSpec]:
    checkpoints = sorted(
        (int(STEP.search(p.name).group(1)), p)
        for p in folder.glob("checkpoint-*")
        if STEP.search(p.name) and (p / "config.json").is_file()
    )
    specs = [
        ModelSpec(f"{label}@step-{step}", "local", path=str(path), step=step, series=label)
        for step, path in checkpoints
    ]
    if (folder / "config.json").is_file():
        summary = folder / "summary.json"
        step = json.loads(summary.read_text())["global_step"] if summary.is_file() else None
        if step is None and STEP.search(folder.name):
            step = int(STEP.search(folder.name).group(1))
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


def expand_spec(spec: str, download_to: Path) -> list[ModelSpec]:
    """The model(s) a spec names (see module docstring)."""
    if spec.startswith("openai:"):
        name, _, url = spec.removeprefix("openai:").partition("@")
        if not name:
            raise GrailError(f"--model {spec}: expected openai:NAME or openai:NAME@URL")
        if not url and not os.environ.get("OPENAI_API_KEY"):
            raise GrailError(
                f"--model {spec}: the OpenAI API needs OPENAI_API_KEY in the "
                "environment (or give an endpoint: openai:NAME@URL)"
            )
        return [
            ModelSpec(
                name if not url else f"{name}@{url}", "openai", model=name, base_url=url or None
            )
        ]
    if spec.startswith(("s3://", "file://")):
        from grail.checkpoints import complete_checkpoints
        from grail.storage import Location, download_folder

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
    specs = _local_specs(folder, folder.name)
    if not specs:
        raise GrailError(f"--model {spec}: no config.json and no checkpoint-N folders inside")
    return specs


BACKENDS = ("auto", "transformers", "vllm")


def local_backend(wanted: str = "auto") -> str:
    """The generator for local models: ``vllm`` where a GPU and vLLM are present, else
    ``transformers``; a forced ``vllm`` without them is an error naming what is missing."""
    import importlib.util

    import torch

    if wanted not in BACKENDS:
        raise GrailError(f"--backend {wanted!r}: choose one of {', '.join(BACKENDS)}")
    gpu = torch.cuda.is_available()
    vllm = importlib.util.find_spec("vllm") is not None
    if wanted == "vllm" and not (gpu and vllm):
        missing = "a CUDA GPU" if not gpu else "the vllm package (the training image has it)"
        raise GrailError(f"--backend vllm needs {missing}")
    if wanted == "auto":
        return "vllm" if gpu and vllm else "transformers"
    return wanted


def tensor_parallel_size(gpus: int, attention_heads: int) -> int:
    """The most GPUs (at most `gpus`) that evenly split the model's attention heads.

    >>> tensor_parallel_size(8, 12), tensor_parallel_size(8, 16), tensor_parallel_size(1, 12)
    (6, 8, 1)
    """
    return max(n for n in range(1, max(gpus, 1) + 1) if attention_heads % n == 0)


def generate_local(
    path: str,
    conversations: list[list[dict]],
    max_new_tokens: int,
    batch_size: int,
    backend: str,
) -> list[str]:
    """Greedy completions from a local model with the chosen backend."""
    if local_backend(backend) == "vllm":
        return generate_vllm(path, conversations, max_new_tokens)
    return generate_transformers(path, conversations, max_new_tokens, batch_size)


def generate_transformers(
    path: str, conversations: list[list[dict]], max_new_tokens: int, batch_size: int
) -> list[str]:
    """Greedy completions with transformers, batched with left padding."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype="auto").to(device).eval()
    texts = [
        tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
        for c in conversations
    ]
    answers = []
    progress = Progress(f"{Path(path).name}: completions", len(texts))
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(
            texts[start : start + batch_size],
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
        ).to(device)
        with torch.inference_mode():
            output = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        answers += tokenizer.batch_decode(
            output[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
        )
        progress.update(len(answers))
    return answers


def generate_vllm(path: str, conversations: list[list[dict]], max_new_tokens: int) -> list[str]:
    """Greedy completions with vLLM's offline engine, tensor-parallel over the visible GPUs.

    One engine per checkpoint, torn down before the next one loads (the GPU memory it holds
    would otherwise stay claimed).
    """
    import gc

    import torch
    from transformers import AutoConfig
    from vllm import LLM, SamplingParams

    heads = AutoConfig.from_pretrained(path).num_attention_heads
    engine = LLM(
        model=path,
        tensor_parallel_size=tensor_parallel_size(torch.cuda.device_count(), heads),
        dtype="auto",
        seed=0,
    )
    try:
        sampling = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
        outputs = engine.chat(conversations, sampling, use_tqdm=False)
        return [output.outputs[0].text for output in outputs]
    finally:
        del engine
        gc.collect()
        torch.cuda.empty_cache()


def request(spec: ModelSpec, messages: list[dict], max_tokens: int) -> dict:
    """The chat-completions request body sent for one prompt."""
    return {"model": spec.model, "messages": messages, "temperature": 0, "max_tokens": max_tokens}


def generate_openai(
    spec: ModelSpec,
    conversations: list[list[dict]],
    max_tokens: int,
    concurrency: int,
    retries: int = 4,
    timeout: float = 60.0,
) -> list[str | None]:
    """Completions from an OpenAI-compatible endpoint; None where a request kept failing.

    The first request goes alone, so an unreachable endpoint fails at once with a clear message.
    """
    import openai

    client = openai.OpenAI(
        base_url=spec.base_url,
        api_key=os.environ.get("OPENAI_API_KEY") or "not-needed",
        max_retries=retries,
        timeout=timeout,
    )

    def ask(messages: list[dict], api=client) -> str | None:
        message = (
            api.chat.completions.create(**request(spec, messages, max_tokens)).choices[0].message
        )
        extra = message.model_extra or {}
        # Servers with a reasoning parser (vLLM, transformers serve) move <think> out of content.
        reasoning = extra.get("reasoning_content") or extra.get("reasoning")
        return (
            f"<think>{reasoning}</think>{message.content or ''}" if reasoning else message.content
        )

    if not conversations:
        return []
    try:  # a probe with one retry: an unreachable endpoint fails in about a second
        first = ask(conversations[0], client.with_options(max_retries=1))
    except openai.APIConnectionError:
        raise GrailError(f"{spec.name}: cannot reach {spec.base_url or 'the OpenAI API'}") from None
    except openai.APIStatusError as err:
        raise GrailError(
            f"{spec.name}: the endpoint answered {err.status_code}: {str(err.message)[:200]}"
        ) from None

    def ask_or_none(messages: list[dict]) -> str | None:
        try:
            return ask(messages)
        except openai.OpenAIError as err:  # after the client's retries: count it, keep going
            logger.warning("%s: request failed after %d retries: %s", spec.name, retries, err)
            return None

    progress = Progress(f"{spec.name}: completions", len(conversations))
    answers = [first]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for answer in pool.map(ask_or_none, conversations[1:]):
            answers.append(answer)
            progress.update(len(answers))
    return answers


def dry_run(spec: ModelSpec, conversations: list[list[dict]], max_tokens: int) -> str:
    """What a run would send, without sending anything."""
    first = json.dumps(request(spec, conversations[0], max_tokens), indent=1, ensure_ascii=False)
    return (
        f"[dry run] {spec.name}: {len(conversations)} chat-completions requests to "
        f"{spec.base_url or 'https://api.openai.com/v1'}; the first:\n{first}"
    )
