"""Benchmark model evaluation (the benchmark stage's generation): validation rows per second.

- CPU (default): the tiny offline model with transformers at batch sizes 1 and 16.
- ``--vllm-cpu`` (in ``.venv-vllm``, ``make install-vllm``): a tiny model with head size 64 (or
  ``--model FOLDER``, a real one: ``make real-model-assets``) on the same rows with the
  transformers backend and with vLLM's CPU build (engine started once, before the timing), and
  the ratio of their rows per second.
- ``--gpu``: a Qwen2.5-1.5B-shaped model built from its config (random weights, nothing
  downloaded) with transformers (batch 16, 64) and with vLLM's offline engine, the backend the
  benchmark picks on the GPU pool (``grail benchmark --backend auto``).

Run: ``.venv/bin/python bench/predict.py [--rows 64]``, ``.venv-vllm/bin/python
bench/predict.py --vllm-cpu [--rows 128]`` or ``python bench/predict.py --gpu
[--rows 512] [--max-new-tokens 256]`` (in the training image, on a GPU). Prints a Markdown table;
each figure is one timed pass after a warm-up on a few rows.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from train import QWEN25_15B

from grail.clean.stage import clean
from grail.inference.local import (  # [4] * n: timing, not scores
    answer_transformers,
    answer_vllm,
    answer_with_engine,
    vllm_engine,
)
from grail.tasks.slate.contract import read_dataset
from grail.tasks.slate.prompts import PromptOptions, to_example
from grail.tasks.slate.simulate import simulate
from grail.tasks.slate.warmup import STEPS as TINY_WARMUP
from grail.train.tiny import build_tiny_model


def conversations(data: Path, rows: int) -> list[list[dict]]:
    table = read_dataset(data, split="validation").to_pylist()[:rows]
    return [to_example(row, PromptOptions())["prompt"] for row in table]


def timed(label: str, generate, prompts: list, max_new_tokens: int) -> dict:
    generate(prompts[:4], max_new_tokens)  # warm-up: loading, compilation, caches
    start = time.perf_counter()
    generate(prompts, max_new_tokens)
    seconds = time.perf_counter() - start
    return {
        "run": label,
        "rows": len(prompts),
        "seconds": seconds,
        "rows/s": len(prompts) / seconds,
    }


def show(results: list[dict], max_new_tokens: int) -> None:
    print(f"| generation (max {max_new_tokens} new tokens) | rows | seconds | rows/s |")
    print("|---|---:|---:|---:|")
    for r in results:
        print(f"| {r['run']} | {r['rows']} | {r['seconds']:.1f} | {r['rows/s']:.1f} |")


def study(tmp: Path) -> Path:
    simulate(tmp / "raw", participants=600, seed=3)
    clean(tmp / "raw", tmp / "clean")
    return tmp / "clean"


def cpu(tmp: Path, rows: int, max_new_tokens: int) -> None:
    data = study(tmp)
    model = str(build_tiny_model(tmp / "tiny", data=data, format_warmup=TINY_WARMUP))
    prompts = conversations(data, rows)
    show(
        [
            timed(
                f"tiny model, transformers, batch {batch} (CPU)",
                lambda p, n, b=batch: answer_transformers(model, p, [4] * len(p), n, batch_size=b),
                prompts,
                max_new_tokens,
            )
            for batch in (1, 16)
        ],
        max_new_tokens,
    )


def vllm_cpu(tmp: Path, rows: int, max_new_tokens: int, model: str | None = None) -> None:
    data = study(tmp)
    name = Path(model).name if model else "tiny model (head 64)"
    model = model or str(
        build_tiny_model(
            tmp / "tiny", data=data, format_warmup=TINY_WARMUP, hidden_size=256, heads=4
        )
    )
    prompts = conversations(data, rows)
    results = [
        timed(
            f"{name}, transformers, batch 16 (CPU)",
            lambda p, n: answer_transformers(model, p, [4] * len(p), n, batch_size=16),
            prompts,
            max_new_tokens,
        )
    ]
    with vllm_engine(model) as engine:
        results.append(
            timed(
                f"{name}, vLLM CPU build, offline engine",
                lambda p, n: answer_with_engine(engine, p, [4] * len(p), n),
                prompts,
                max_new_tokens,
            )
        )
    show(results, max_new_tokens)
    ratio = results[1]["rows/s"] / results[0]["rows/s"]
    print(f"\nvLLM CPU / transformers: {ratio:.2f}x the rows per second (same rows, same model)")


def gpu(tmp: Path, rows: int, max_new_tokens: int) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    data = study(tmp)
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tmp / "tokenizer", data=data))
    config = Qwen2Config(
        **QWEN25_15B, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    with torch.device("cuda"):
        Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp / "qwen")
    tokenizer.save_pretrained(tmp / "qwen")
    torch.cuda.empty_cache()
    model = str(tmp / "qwen")
    prompts = conversations(data, rows)
    results = [
        timed(
            f"Qwen2.5-1.5B shape, transformers, batch {batch}",
            lambda p, n, b=batch: answer_transformers(model, p, [4] * len(p), n, batch_size=b),
            prompts,
            max_new_tokens,
        )
        for batch in (16, 64)
    ]
    results.append(
        timed(
            "Qwen2.5-1.5B shape, vLLM offline",
            lambda p, n: answer_vllm(model, p, [4] * len(p), n),
            prompts,
            max_new_tokens,
        )
    )
    show(results, max_new_tokens)
    print(f"\nGPU: {torch.cuda.get_device_name()} x {torch.cuda.device_count()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="the Qwen2.5-1.5B-shaped GPU run")
    parser.add_argument(
        "--vllm-cpu", action="store_true", help="vLLM's CPU build against transformers"
    )
    parser.add_argument("--rows", type=int, default=None, help="validation rows to generate for")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument(
        "--model",
        default=None,
        help="with --vllm-cpu: a model folder instead of the tiny model (make real-model-assets "
        "imports SmolLM2-135M-Instruct)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="grail-bench-evaluate-") as tmp:
        if args.gpu:
            gpu(Path(tmp), args.rows or 512, args.max_new_tokens or 256)
        elif args.vllm_cpu:
            vllm_cpu(Path(tmp), args.rows or 128, args.max_new_tokens or 32, args.model)
        else:
            cpu(Path(tmp), args.rows or 64, args.max_new_tokens or 32)


if __name__ == "__main__":
    main()
