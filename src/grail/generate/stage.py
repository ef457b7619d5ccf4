"""Stage ``generate``: completions from a model server with distilabel, scored by the rewards.

Run: ``grail generate --data data/ --out gen/ --model openai:NAME@URL [--num-generations 4]
[--split train] [--limit N] [--template prompt.jinja]``.

A distilabel ``Pipeline`` (``LoadDataFromDicts`` >> ``TextGeneration`` with ``OpenAILLM``) sends
the task's training prompts (the same system prompt as training) to any OpenAI-compatible server
(``vllm serve``, ``transformers serve``) or the OpenAI API. Each prompt is sent K times rather
than with ``n=K``, which not every server honours. Every completion is scored by the task's
rewards. What is asked and kept is the data's task's (:data:`grail.tasks.TASKS`, part
``generation``): a slate row's choice, kept when correct (rejection sampling); a document's
summary, its best-answering one kept (a teacher's summaries distilled, as ART's sft-rl does).
Writes:

- ``generated.parquet``: one row per completion (row ids, prompt, completion, what was parsed,
  each reward and the weighted total, model and generation settings);
- ``sft.parquet``: the kept ``messages`` conversations, the input of ``sft_dataset`` in a
  training recipe;
- ``preferences.parquet``: ``prompt`` / ``chosen`` / ``rejected`` pairs of one prompt's better
  and worse completions (TRL's conversational preference format);
- ``summary.json``: counts, acceptance rate, parse rate and failures.

A failed batch is retried one request at a time (``batch_retries`` times); a request that still
fails leaves no row and is counted in ``failures``, so ``generated == rows * K - failures``. An
unreachable endpoint fails at once.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from grail.core.errors import GrailError
from grail.core.outputs import atomic_folder, check_owned
from grail.core.serving import ModelSpec, openai_client, openai_spec, unreachable
from grail.generate.config import GenerateConfig
from grail.tasks import TASKS, recorded_task

logger = logging.getLogger(__name__)


def endpoint_spec(model: str) -> ModelSpec:
    """The OpenAI-compatible endpoint a ``--model`` names (openai:NAME@URL or openai:NAME)."""
    if not model.startswith("openai:"):
        raise GrailError(
            f"--model {model}: generation needs a server: serve the model with "
            "`vllm serve` or `transformers serve` and pass openai:NAME@URL"
        )
    return openai_spec(model)


def probe(spec: ModelSpec, timeout: float = 5.0) -> None:
    """Fail fast, in one line, when the endpoint cannot be reached."""
    import openai

    client = openai_client(spec, retries=0, timeout=timeout)
    try:
        client.models.list()
    except (openai.APIConnectionError, openai.APITimeoutError):
        raise unreachable(spec) from None
    except openai.APIStatusError as err:  # reachable; a server may not implement /models
        if err.status_code in (401, 403):
            raise GrailError(
                f"{spec.name}: the endpoint refused the API key ({err.status_code})"
            ) from None


def distilabel_generate(
    spec: ModelSpec, inputs: list[dict], config: GenerateConfig, batch_size: int, cache_dir: Path
) -> list[dict]:
    """Run the distilabel pipeline: one dict per input, ``generation`` None where it failed."""
    from distilabel.models import OpenAILLM
    from distilabel.pipeline import Pipeline
    from distilabel.steps import LoadDataFromDicts
    from distilabel.steps.tasks import TextGeneration

    llm = OpenAILLM(
        model=spec.model,
        base_url=spec.base_url,
        api_key=os.environ.get("OPENAI_API_KEY") or "not-needed",
        max_retries=config.retries,
        timeout=config.timeout,
    )
    with Pipeline(name="grail-generate", cache_dir=str(cache_dir)) as pipeline:
        load = LoadDataFromDicts(data=inputs, batch_size=batch_size)
        task = TextGeneration(llm=llm, use_system_prompt=True, input_batch_size=batch_size)
        load >> task
    generation_kwargs = {"temperature": config.temperature, "max_new_tokens": config.max_new_tokens}
    handlers = logging.getLogger().handlers[:]  # distilabel leaves a closed queue handler
    try:
        distiset = pipeline.run(
            use_cache=False,
            parameters={task.name: {"llm": {"generation_kwargs": generation_kwargs}}},
        )
    finally:
        logging.getLogger().handlers[:] = handlers
    return list(distiset["default"]["train"])


def generate_with_retries(
    spec: ModelSpec, inputs: list[dict], config: GenerateConfig, cache_dir: Path
) -> tuple[list[dict], int]:
    """Generate; rerun failed inputs one request per batch up to ``batch_retries`` times.

    distilabel fails a whole batch when one of its requests fails (after the client's own
    retries), so a retry in batches of one keeps one bad request from sinking the others.
    Returns the successful outputs in input order and the number of inputs that still failed.
    """
    for number, item in enumerate(inputs):
        item["input_id"] = number
    done: dict[int, dict] = {}
    pending = inputs
    for attempt in range(config.batch_retries + 1):
        batch_size = config.batch_size if attempt == 0 else 1
        for output in distilabel_generate(spec, pending, config, batch_size, cache_dir):
            if output["generation"] is not None:
                done[output["input_id"]] = output
        pending = [item for item in pending if item["input_id"] not in done]
        if not pending:
            break
        logger.warning(
            "%d of %d requests failed; %s",
            len(pending),
            len(inputs),
            "retrying them one by one" if attempt < config.batch_retries else "counted",
        )
    return [done[k] for k in sorted(done)], len(pending)


def run(data: str | Path, out: str | Path, model: str, options=None, **settings) -> dict:
    """Run the stage; returns the summary (also ``out/summary.json``). `settings`: the other
    :class:`GenerateConfig` fields; `options`: how each slate row is asked (PromptOptions)."""
    config = GenerateConfig(data=str(data), out=str(out), model=model, **settings)
    task = recorded_task(data)
    generation = TASKS[task].generation
    if generation is None:
        raise GrailError(f"{data}: the {task} task has no generate stage")
    config.rewards = config.rewards or list(generation.rewards)
    spec = endpoint_spec(model)
    inputs = generation.inputs(data, config, options)
    if not inputs:
        raise GrailError(f"{data}: no rows in the {config.split} split")
    out = Path(out)
    writable_output(out)  # before any request: a refused --out wastes no generation
    probe(spec)
    started = time.perf_counter()
    cache = out.parent / f".{out.name}.distilabel"  # distilabel's own cache, beside the output
    cache.parent.mkdir(parents=True, exist_ok=True)
    outputs, failures = generate_with_retries(spec, inputs, config, cache)
    if not outputs:
        raise GenerationFailed(
            f"{model}: every one of the {len(inputs)} requests failed (the log above says "
            f"why); {out} was not written"
        )
    records = [generation.record(o, spec.name, config) for o in outputs]
    if records:
        generation.score(records, config.rewards, config.reward_weights)
    sft, pairs = generation.keep(records)
    rows = len(inputs) // config.num_generations
    summary = summarize(config, spec.name, rows, len(inputs), records, len(sft), len(pairs))
    summary |= {"task": task, "failures": failures}
    summary["seconds"] = round(time.perf_counter() - started, 2)
    sft_schema, pairs_schema = generation.schemas()
    with atomic_folder(out, "generate") as staging:  # complete or absent, never mixed
        pq.write_table(pa.Table.from_pylist(records), staging / "generated.parquet")
        pq.write_table(pa.Table.from_pylist(sft, schema=sft_schema), staging / "sft.parquet")
        pq.write_table(
            pa.Table.from_pylist(pairs, schema=pairs_schema), staging / "preferences.parquet"
        )
        (staging / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


class GenerationFailed(GrailError):
    """Every request failed: nothing to write (exit 1: the inputs were in range)."""

    exit_code = 1


def writable_output(out: Path) -> None:
    """Refuse, before generating, an ``--out`` that is not generate's to write (another
    command's output, someone's folder, the filesystem's root) or whose parent this process
    may not write (the staging folder and distilabel's cache go beside it)."""
    if out.resolve() == Path(out.resolve().anchor):
        raise GrailError(f"--out {out}: the filesystem's root; name a folder of its own")
    check_owned(out, "generate")
    parent = out.resolve().parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise GrailError(f"--out {out}: {parent} is not writable by this process")


def summarize(
    config: GenerateConfig,
    model: str,
    rows: int,
    requested: int,
    records: list[dict],
    sft_rows: int,
    pairs: int,
) -> dict:
    """summary.json: counts, rates and the settings used."""
    generated = len(records)
    parsed = sum(r["parsed"] for r in records)
    settings = asdict(config)
    return {
        "model": model,
        "rows": rows,
        "num_generations": config.num_generations,
        "requested": requested,
        "generated": generated,
        "correct": sft_rows,
        "sft_rows": sft_rows,
        "preference_pairs": pairs,
        "acceptance_rate": round(sft_rows / generated, 4) if generated else 0.0,
        "parse_rate": round(parsed / generated, 4) if generated else 0.0,
        "settings": {
            key: settings[key]
            for key in (
                "temperature",
                "max_new_tokens",
                "batch_size",
                "retries",
                "timeout",
                "batch_retries",
                "split",
                "limit",
                "template",
                "rewards",
                "reward_weights",
            )
        },
    }
