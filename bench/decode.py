"""GRPO's generation without vLLM, on CPU, under bf16 mixed precision over fp32 weights (the
one-GPU recipes' precision): TRL's generation against grail's, through the trainer grail builds,
on the same prompts (each 8 times, as TRL repeats a prompt for its group). Two passes differ:

- the prefill: TRL's prefills every copy of a prompt; grail's prefills each prompt once and
  copies its KV cache to the group (:class:`grail.train.generation.SharedPrefill`);
- each decoding step: in TRL's, accelerate's autocast is entered at every forward and every
  weight is cast again at every token; grail's runs inside one autocast, each weight cast once
  per generation (:func:`grail.train.grpo.casts_once_per_generation`).

A third row is grail's generation with ``attn_implementation: sdpa_flex``, whose decoding
steps read the KV cache as it is (:func:`grail.train.attention.grouped_decoding`), where
transformers' SDPA function copies it once per query head of a key/value head's group (6 in
Qwen2.5-1.5B: 12 query heads, 2 key/value heads, which the model here has too).

The model is a tiny random one as deep as Qwen2.5-1.5B-Instruct (28 layers) and narrow, so
that the per-operator cost a GPU also pays (dispatch; a GPU adds a kernel launch and the
cast's memory traffic) is not hidden by arithmetic. The weight casts are exact; the times are
a CPU's: with 64 completions a toy-width decoding step is mostly attention and copies of the
KV cache, where the casts saved are a small share and the two generations differ by less than
this machine's drift. A GPU's figure: ``make bench-gpu`` (its ``after`` rows generate as grail
does, ``before`` as TRL does; its phase table times generation).

Run: ``.venv/bin/python bench/decode.py [--layers 28] [--prompts 1 8] [--threads 1]`` (prompts
of the study, each 8 times). Prints a Markdown table: milliseconds of a prefill (a generation of
one token) and per decoding step (the difference of two completion lengths), each the best of
five runs, the two generations taking turns, grail's against TRL's, and the weight casts of one
generation.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModelForCausalLM
from trl import GRPOTrainer

import grail.train.attention  # noqa: F401  (registers sdpa_flex)
from grail.clean.stage import clean
from grail.tasks.slate.simulate import simulate
from grail.train.config import parse_train_args
from grail.train.tiny import build_tiny_model
from grail.train.trainer import build_trainer

ROOT = Path(__file__).resolve().parents[1]
GROUP = 8  # completions per prompt, as in the 1.5B recipes
SHORT, LONG = 8, 40  # completion lengths timed; their difference gives a decoding step
REPEATS = 5
GENERATIONS = {
    "TRL": "TRL: each copy of a prompt prefilled, an autocast per forward",
    "grail": "grail: each prompt prefilled once, one autocast per generation",
    "grail, sdpa_flex": "grail, sdpa_flex: and the cache read without a copy per query head",
}
HEADS, KV_HEADS = 12, 2  # Qwen2.5-1.5B-Instruct's; a head of 8 at the tiny width of 96


class WeightCasts(TorchDispatchMode):
    """How many copies are made of the given weights (autocast's casts)."""

    def __init__(self, weights):
        super().__init__()
        self.storages = {w.untyped_storage().data_ptr() for w in weights}
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.count += args[0].untyped_storage().data_ptr() in self.storages
        return func(*args, **(kwargs or {}))


def trainer_for(work: Path, layers: int):
    simulate(work / "raw", participants=300, seed=3)
    clean(work / "raw", work / "clean")
    policy = build_tiny_model(
        work / "policy", data=work / "clean", layers=layers, hidden_size=96, heads=HEADS
    )
    config = AutoConfig.from_pretrained(policy)
    config.num_key_value_heads = KV_HEADS  # tiny models have half as many as query heads
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(policy)
    config, model_config = parse_train_args(
        [
            "--config",
            str(ROOT / "recipes" / "tiny" / "config_grpo.yaml"),
            "--dataset",
            str(work / "clean"),
            "--model_name_or_path",
            str(policy),
            "--output_dir",
            str(work / "out"),
            "--use_cpu",
            "true",
            "--bf16",
            "true",
            "--sft_dataset",
            "",
            "--report_to",
            "none",
        ]  # fmt: skip
    )
    trainer, _ = build_trainer(config, model_config)
    trainer.accelerator.prepare_model(trainer.model)  # as train() does: accelerate's autocast
    return trainer


def timed(trainer, prompts: list[list[int]], weights) -> list[tuple[str, float, float, int]]:
    """(generation, seconds of a prefill, seconds per decoding step, weight casts of one
    generation) for TRL's and grail's generation of `prompts`: each length timed REPEATS
    times, the two generations taking turns (this machine's speed drifts), the fastest of each
    kept. A prefill is a generation of one token (its logits are the prefill's)."""
    shared = trainer.model.__dict__.pop("generate")  # grail's (grail.train.generation)
    generations = {  # (TRL's method, grail's generate on the model or None, attention)
        "TRL": (GRPOTrainer._generate_single_turn, None, "sdpa"),  # the model's own generate
        "grail": (type(trainer)._generate_single_turn, shared, "sdpa"),
        "grail, sdpa_flex": (type(trainer)._generate_single_turn, shared, "sdpa_flex"),
    }

    def seconds(name: str, tokens: int) -> float:
        method, generate, attention = generations[name]
        trainer.model.__dict__.pop("generate", None)
        if generate is not None:
            trainer.model.generate = generate
        trainer.model.set_attn_implementation(attention)
        trainer.generation_config.min_new_tokens = tokens
        trainer.generation_config.max_new_tokens = tokens
        start = time.perf_counter()
        method(trainer, prompts, None, {}, GROUP)
        return time.perf_counter() - start

    best = {(name, tokens): math.inf for name in generations for tokens in (1, SHORT, LONG)}
    for name in generations:
        seconds(name, SHORT)  # warm-up
    for _ in range(REPEATS):
        for name, tokens in best:
            best[name, tokens] = min(best[name, tokens], seconds(name, tokens))
    rows = []
    for name in generations:
        with WeightCasts(weights) as casts:
            seconds(name, SHORT)
        step = (best[name, LONG] - best[name, SHORT]) / (LONG - SHORT)
        rows.append((GENERATIONS[name], best[name, 1], step, casts.count))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=28, help="Qwen2.5-1.5B-Instruct's 28")
    parser.add_argument(
        "--prompts", type=int, nargs="+", default=[1, 8], help=f"each {GROUP} times; a row each"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch's (1: steadier times)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    trainer = trainer_for(Path(tempfile.mkdtemp(prefix="grail-decode-")), args.layers)
    tokenizer = trainer.processing_class
    weights = [w for w in trainer.model.parameters() if w.dtype == torch.float32]
    print(f"{args.layers} layers; {SHORT} and {LONG} tokens generated; {args.threads} thread(s)")
    print(
        "| completions (prompt tokens) | generation | ms prefill | ratio | ms per decoding step "
        f"| ratio | weight casts ({SHORT} tokens) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for count in args.prompts:
        chats = trainer.train_dataset.select(range(count))["prompt"]
        prompts = [
            tokenizer.apply_chat_template(
                chat, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
            for chat in chats
            for _ in range(GROUP)
        ]
        rows = timed(trainer, prompts, weights)
        shape = f"{len(prompts)} (~{sum(map(len, prompts)) // len(prompts)})"
        for name, prefill, step, casts in rows:
            print(
                f"| {shape} | {name} | {prefill * 1000:.1f} | {prefill / rows[0][1]:.2f} "
                f"| {step * 1000:.1f} | {step / rows[0][2]:.2f} | {casts:,} |"
            )


if __name__ == "__main__":
    main()
