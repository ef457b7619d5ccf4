"""Benchmark the training stage: seconds per step of tiny GRPO and tiny GRAIL on CPU (and the
ratio; tiny GRPO also with TRL's fused LM head scoring every prompt position, as TRL 1.16 does
on CPU, against the completions only, as grail makes it), or, with ``--gpu``, a
Qwen2.5-1.5B-shaped model built from its config (random weights, nothing downloaded): seconds
per step, generated tokens/s, and the generation/training split.

Run: ``.venv/bin/python bench/train.py [--steps 20]`` or ``python bench/train.py --gpu
[--steps 10] [--vllm]``. Prints a Markdown table. The first step (warm-up) is left out of the
medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import transformers

from grail.clean.stage import clean
from grail.tasks.slate.simulate import simulate
from grail.tasks.slate.warmup import STEPS as TINY_WARMUP
from grail.train import trainer as grail_trainer
from grail.train.config import parse_train_args
from grail.train.stage import run
from grail.train.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]

# Qwen/Qwen2.5-1.5B-Instruct's config.json, written out so nothing is downloaded.
QWEN25_15B = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    sliding_window=None,
    use_sliding_window=False,
)

GENERATE_SECONDS: list[float] = []


def _timed_generate(original):
    def generate(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            GENERATE_SECONDS.append(time.perf_counter() - start)

    return generate


def _run(recipe: Path, data: Path, model: Path, out: Path, *extra) -> tuple[list[dict], int]:
    """The run's metric rows, and the completions it samples per optimizer step."""
    GENERATE_SECONDS.clear()
    config, model_config = parse_train_args(
        [
            "--config",
            str(recipe),
            "--dataset",
            str(data),
            "--model_name_or_path",
            str(model),
            "--output_dir",
            str(out),
            "--save_strategy",
            "no",
            "--disable_tqdm",
            "true",
            *map(str, extra),
        ]
    )
    run(config, model_config)
    per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
    return json.loads((out / "metrics.json").read_text()), per_step


def _row(name: str, result: tuple[list[dict], int]) -> dict:
    rows, completions_per_step = result
    steady = rows[1:] or rows
    step = statistics.median(r["step_time"] for r in steady)
    generate = statistics.median(GENERATE_SECONDS[1:] or GENERATE_SECONDS or [0.0])
    tokens = statistics.median(r["completions/mean_length"] for r in steady) * completions_per_step
    return {
        "run": name,
        "steps": len(rows),
        "s/step": step,
        "generated tok/s": tokens / generate if generate else float("nan"),
        "generation share": generate / step,
    }


def _print(rows: list[dict]) -> None:
    print("| run | steps | s/step (median) | generated tok/s | generation share |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['run']} | {r['steps']} | {r['s/step']:.3f} | {r['generated tok/s']:,.0f} | "
            f"{r['generation share']:.0%} |"
        )


def cpu(steps: int, tmp: Path) -> None:
    simulate(tmp / "raw", participants=300, seed=3)
    clean(tmp / "raw", tmp / "clean")
    policy = build_tiny_model(tmp / "policy", data=tmp / "clean", format_warmup=TINY_WARMUP)
    discriminator = build_tiny_model(tmp / "disc", data=tmp / "clean", task="classifier")
    recipes = ROOT / "recipes" / "tiny"
    grpo = _row(
        "tiny GRPO (CPU)",
        _run(
            recipes / "config_grpo.yaml", tmp / "clean", policy, tmp / "grpo", "--max_steps", steps
        ),
    )
    grail = _row(
        "tiny GRAIL (CPU)",
        _run(
            recipes / "config_grail.yaml",
            tmp / "clean",
            policy,
            tmp / "grail",
            "--max_steps",
            steps,
            "--gail_model",
            discriminator,
        ),
    )
    with every_position_scored():
        full = _row(
            "tiny GRPO (CPU), TRL's fused head scoring every position",
            _run(
                recipes / "config_grpo.yaml",
                tmp / "clean",
                policy,
                tmp / "grpo-full",
                "--max_steps",
                steps,
            ),
        )
    _print([grpo, grail, full])
    print(f"\nGRAIL / GRPO seconds per step: {grail['s/step'] / grpo['s/step']:.2f}")
    print(f"every position / completions only, GRPO s/step: {full['s/step'] / grpo['s/step']:.2f}")


@contextmanager
def every_position_scored():
    """TRL's own choice on CPU: without grail.train.trainer.score_completions_only_on_cpu."""
    from trl.trainer import utils

    patched, chosen = grail_trainer.score_completions_only_on_cpu, utils._use_triton
    original = getattr(chosen, "__wrapped__", chosen)
    grail_trainer.score_completions_only_on_cpu, utils._use_triton = (lambda: None), original
    try:
        yield
    finally:
        grail_trainer.score_completions_only_on_cpu, utils._use_triton = patched, chosen


def gpu(steps: int, tmp: Path, vllm: bool) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    simulate(tmp / "raw", participants=600, seed=3)
    clean(tmp / "raw", tmp / "clean")
    tiny = build_tiny_model(tmp / "tokenizer", data=tmp / "clean")  # its tokenizer, offline
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny)
    config = Qwen2Config(
        **QWEN25_15B, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(tmp / "qwen2.5-1.5b-shape")
    tokenizer.save_pretrained(tmp / "qwen2.5-1.5b-shape")
    del model
    recipe = ROOT / "recipes" / "Qwen2.5-1.5B-Instruct" / "grpo" / "config_grpo_gun.yaml"
    extra = [
        "--max_steps",
        steps,
        "--checkpoint_uri",
        "",
        "--report_to",
        "none",
        "--eval_strategy",
        "no",
        "--issues",
        "gun_control",
        "--use_vllm",
        str(vllm).lower(),
        "--max_completion_length",
        256,
    ]
    result = _run(recipe, tmp / "clean", tmp / "qwen2.5-1.5b-shape", tmp / "out", *extra)
    label = f"Qwen2.5-1.5B shape, {'vLLM colocate' if vllm else 'transformers'} generation"
    _print([_row(label, result)])
    print(
        f"\nGPU: {torch.cuda.get_device_name()}, peak memory "
        f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="training steps per run")
    parser.add_argument("--gpu", action="store_true", help="the Qwen2.5-1.5B-shaped GPU run")
    parser.add_argument("--vllm", action="store_true", help="GPU run with vLLM colocated")
    args = parser.parse_args()
    transformers.GenerationMixin.generate = _timed_generate(transformers.GenerationMixin.generate)
    with tempfile.TemporaryDirectory(prefix="grail-bench-train-") as tmp:
        if args.gpu:
            gpu(args.steps or 10, Path(tmp), args.vllm)
        else:
            cpu(args.steps or 20, Path(tmp))


if __name__ == "__main__":
    main()
