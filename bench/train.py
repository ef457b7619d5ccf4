"""Benchmark the training stage: seconds per step of tiny GRPO and tiny GRAIL on CPU (and the
ratio; tiny GRPO also with TRL's fused LM head scoring every prompt position, as TRL 1.16 does
on CPU, against the completions only, as grail makes it): seconds per step, generated tokens/s,
and the generation/training split. With ``--vllm``: tiny GRPO on CPU with vLLM's CPU build
colocated, beside transformers' generation on the same policy (TRL's weight sync into vLLM
replaced by a no-op: it fails on vLLM's CPU build). The production shape on a GPU:
``bench/gpu.py`` (``make bench-gpu``).

Run: ``.venv/bin/python bench/train.py [--steps 20]`` or ``.venv-vllm/bin/python bench/train.py
--vllm [--steps 3]``. Prints a Markdown table. The first step (warm-up) is left out of the
medians. Generation is timed around the trainer's ``_generate_single_turn``: transformers'
``generate`` or TRL's vLLM engine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from grail.clean.stage import clean
from grail.tasks.slate.simulate import simulate
from grail.tasks.slate.warmup import STEPS as TINY_WARMUP
from grail.train import overrides
from grail.train.config import parse_train_args
from grail.train.overrides import GrailGRPOTrainer
from grail.train.stage import run
from grail.train.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]

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
    whole = _row(
        "tiny GRPO (CPU), every completion's row with its prompt",
        _run(
            recipes / "config_grpo.yaml",
            tmp / "clean",
            policy,
            tmp / "grpo-whole",
            "--max_steps",
            steps,
            "--share_group_prompts",
            "false",
        ),
    )
    _print([grpo, grail, full, whole])
    print(f"\nGRAIL / GRPO seconds per step: {grail['s/step'] / grpo['s/step']:.2f}")
    print(f"every position / completions only, GRPO s/step: {full['s/step'] / grpo['s/step']:.2f}")
    print(f"prompts whole / read once, GRPO s/step: {whole['s/step'] / grpo['s/step']:.2f}")


@contextmanager
def every_position_scored():
    """TRL's own choice on CPU: without grail.train.overrides.score_completions_only_on_cpu."""
    patched = overrides.score_completions_only_on_cpu
    overrides.score_completions_only_on_cpu = lambda: None
    try:
        with overrides.trls_own_head_choice():
            yield
    finally:
        overrides.score_completions_only_on_cpu = patched


def cpu_vllm(steps: int, tmp: Path) -> None:
    """Tiny GRPO on CPU with transformers' generation, then with vLLM's CPU build colocated, from
    one policy vLLM's CPU attention takes (head size 64; it refuses the default tiny model's 16).

    TRL's weight sync into vLLM fails on vLLM's CPU build ("'Parameter' object has no attribute
    'weight_loader'", tests/test_vllm.py's docstring), so it is replaced by a no-op: the engine
    generates from the policy's starting weights at every step. That changes what is sampled
    after step 1; a step's work stays comparable, less the sync's (left out of s/step)."""
    import os

    from trl.generation.vllm_generation import VLLMGeneration

    # vLLM's CPU engine reserves its KV cache up front (GiB); its default would take 4
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    simulate(tmp / "raw", participants=300, seed=3)
    clean(tmp / "raw", tmp / "clean")
    policy = build_tiny_model(
        tmp / "policy", data=tmp / "clean", format_warmup=TINY_WARMUP, hidden_size=256, heads=4
    )
    recipe = ROOT / "recipes" / "tiny" / "config_grpo.yaml"
    # the behaviour-cloning warm start is not what is timed: GRPO starts from the tiny policy
    extra = ["--max_steps", steps, "--sft_dataset", ""]
    name = "tiny GRPO, head size 64 (CPU)"
    rows = [
        _row(
            f"{name}, transformers generation",
            _run(recipe, tmp / "clean", policy, tmp / "hf", *extra),
        )
    ]
    VLLMGeneration.sync_weights = lambda self: None  # see the docstring
    colocated = ["--use_vllm", "true", "--vllm_mode", "colocate"]
    rows.append(
        _row(
            f"{name}, vLLM colocate generation (weight sync off)",
            _run(recipe, tmp / "clean", policy, tmp / "vllm", *extra, *colocated),
        )
    )
    _print(rows)
    print(
        "\nvLLM: TRL's weight sync into the engine was replaced by a no-op (it fails on vLLM's "
        "CPU build): the engine generated from the starting weights at every step, and s/step "
        "leaves the sync out."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="training steps per run")
    parser.add_argument(
        "--vllm",
        action="store_true",
        help="tiny GRPO with vLLM's CPU build colocated (.venv-vllm)",
    )
    args = parser.parse_args()
    # both paths: transformers' generate and TRL's vLLM engine
    GrailGRPOTrainer._generate_single_turn = _timed_generate(GrailGRPOTrainer._generate_single_turn)
    with tempfile.TemporaryDirectory(prefix="grail-bench-train-") as tmp:
        if args.vllm:
            cpu_vllm(args.steps or 3, Path(tmp))
        else:
            cpu(args.steps or 20, Path(tmp))


if __name__ == "__main__":
    main()
