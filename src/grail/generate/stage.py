"""Stage ``generate``: completions from a model server with distilabel, scored by the rewards.

Run: ``grail generate --data data/ --out gen/ --model openai:NAME@URL [--num-generations 4]
[--split train] [--limit N] [--template prompt.jinja]``.

A distilabel ``Pipeline`` (``LoadDataFromDicts`` >> ``TextGeneration`` with ``OpenAILLM``) sends
the prompt builder's prompts (the same system prompt as training) to any OpenAI-compatible server
(``vllm serve``, ``transformers serve``) or the OpenAI API. Each prompt is sent K times rather
than with ``n=K``, which not every server honours. Every completion is scored by the reward
registry. Writes:

- ``generated.parquet``: one row per completion (row ids, prompt, completion, parsed answer,
  each reward and the weighted total, model and generation settings);
- ``sft.parquet``: ``messages`` conversations whose answer is correct (rejection sampling), the
  input of ``sft_dataset`` in a training recipe;
- ``preferences.parquet``: ``prompt`` / ``chosen`` / ``rejected`` pairs where a prompt has both a
  correct and a wrong completion (TRL's conversational preference format);
- ``summary.json``: counts, acceptance rate, parse rate and failures.

A failed batch is retried one request at a time (``batch_retries`` times); a request that still
fails leaves no row and is counted in ``failures``, so ``generated == rows * K - failures``. An
unreachable endpoint fails at once.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from grail.core.errors import GrailError
from grail.core.outputs import atomic_folder
from grail.core.rewards import completion_text, resolve_rewards
from grail.core.serving import ModelSpec, openai_client, openai_spec, unreachable
from grail.generate.config import GenerateConfig
from grail.tasks.slate.contract import read_dataset
from grail.tasks.slate.prompts import PromptOptions, build_user_prompt, shuffle_slate, system_prompt
from grail.tasks.slate.rewards import REWARDS, parse_answer

logger = logging.getLogger(__name__)
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
SFT_SCHEMA = pa.schema(
    [("session_id", pa.string()), ("step_index", pa.int64()), ("messages", pa.list_(MESSAGE))]
)
PREFERENCE_SCHEMA = pa.schema(
    [
        ("session_id", pa.string()),
        ("step_index", pa.int64()),
        ("prompt", pa.list_(MESSAGE)),
        ("chosen", pa.list_(MESSAGE)),
        ("rejected", pa.list_(MESSAGE)),
    ]
)


def load_template(path: str | None):
    """A Jinja template that replaces the user prompt; it sees ``row`` (a contract row)."""
    if path is None:
        return None
    import jinja2

    try:
        source = Path(path).read_text()
        return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(source)
    except FileNotFoundError:
        raise GrailError(f"{path}: template not found") from None
    except jinja2.TemplateSyntaxError as err:
        raise GrailError(f"{path}: line {err.lineno}: {err.message}") from None


def render_user_prompt(row: dict, options: PromptOptions, template, template_path) -> str:
    if template is None:
        return build_user_prompt(row, options)
    import jinja2

    try:
        return template.render(row=row)
    except jinja2.UndefinedError as err:
        raise GrailError(f"{template_path}: {err.message}") from None


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


def score_completions(
    records: list[dict], reward_names: list[str], weights: list[float] | None
) -> None:
    """Add the parsed answer, each reward and the weighted total to every record, in place."""
    funcs, normalized = resolve_rewards(reward_names, weights, REWARDS)
    prompts = [r["prompt"] for r in records]
    completions = [r["completion"] for r in records]
    columns = {k: [r[k] for r in records] for k in ("gold_index", "n_options", "opinion_direction")}
    for name, func, weight in zip(reward_names, funcs, normalized, strict=True):
        values = func(prompts, completions, **columns)
        for record, value in zip(records, values, strict=True):
            record[f"reward_{name}"] = value
            record["reward"] = record.get("reward", 0.0) + weight * (value or 0.0)
    for record in records:
        record["parsed_answer"] = parse_answer(
            completion_text(record["completion"]), record["n_options"]
        )
        record["correct"] = record["parsed_answer"] == record["gold_index"]


def preference_pairs(records: list[dict]) -> list[dict]:
    """One (chosen, rejected) pair per wrong completion of a prompt that also has a correct one."""
    by_prompt: dict[tuple, list[dict]] = {}
    for record in records:
        by_prompt.setdefault((record["session_id"], record["step_index"]), []).append(record)
    pairs = []
    for group in by_prompt.values():
        right = [r for r in group if r["correct"]]
        wrong = [r for r in group if not r["correct"]]
        for chosen, rejected in zip(itertools.cycle(right), wrong) if right else ():
            pairs.append(
                {
                    "session_id": chosen["session_id"],
                    "step_index": chosen["step_index"],
                    "prompt": chosen["prompt"],
                    "chosen": [{"role": "assistant", "content": chosen["completion"]}],
                    "rejected": [{"role": "assistant", "content": rejected["completion"]}],
                }
            )
    return pairs


def run(
    data: str | Path, out: str | Path, model: str, options: PromptOptions | None = None, **settings
) -> dict:
    """Run the stage; returns the summary (also ``out/summary.json``). `settings`: the other
    :class:`GenerateConfig` fields; `options`: how each row is asked."""
    config = GenerateConfig(data=str(data), out=str(out), model=model, **settings)
    options = options or PromptOptions()
    spec = endpoint_spec(model)
    jinja = load_template(config.template)
    rows = read_dataset(data, split=config.split).to_pylist()[: config.limit]
    if not rows:
        raise GrailError(f"{data}: no rows in the {config.split} split")
    probe(spec)
    started = time.perf_counter()
    inputs = build_inputs(rows, config, options, jinja)
    out = Path(out)
    cache = out.parent / f".{out.name}.distilabel"  # distilabel's own cache, beside the output
    cache.parent.mkdir(parents=True, exist_ok=True)
    outputs, failures = generate_with_retries(spec, inputs, config, cache)
    records = [to_record(o, spec.name, config) for o in outputs]
    if records:
        score_completions(records, config.rewards, config.reward_weights)
    sft = [
        {
            "session_id": r["session_id"],
            "step_index": r["step_index"],
            "messages": r["prompt"] + [{"role": "assistant", "content": r["completion"]}],
        }
        for r in records
        if r["correct"]
    ]
    pairs = preference_pairs(records)
    summary = summarize(config, spec.name, len(rows), len(inputs), records, len(sft), len(pairs))
    summary |= {"failures": failures, "seconds": round(time.perf_counter() - started, 2)}
    with atomic_folder(out, "generate") as staging:  # complete or absent, never mixed
        pq.write_table(pa.Table.from_pylist(records), staging / "generated.parquet")
        pq.write_table(pa.Table.from_pylist(sft, schema=SFT_SCHEMA), staging / "sft.parquet")
        pq.write_table(
            pa.Table.from_pylist(pairs, schema=PREFERENCE_SCHEMA), staging / "preferences.parquet"
        )
        (staging / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def build_inputs(rows: list[dict], config: GenerateConfig, options: PromptOptions, jinja) -> list:
    """distilabel's inputs: each row's prompt (options shuffled when asked), num_generations
    times, with what scoring needs carried along."""
    system = system_prompt(options)
    inputs = []
    for row in rows:
        shown = (
            shuffle_slate(row, options.shuffle_seed) if options.shuffle_seed is not None else row
        )
        instruction = render_user_prompt(shown, options, jinja, config.template)
        inputs += [
            {
                "instruction": instruction,
                "system_prompt": system,
                "session_id": row["session_id"],
                "step_index": row["step_index"],
                "participant_id": row["participant_id"],
                "generation_index": k,
                "gold_index": shown["gold_index"],
                "n_options": row["n_options"],
                "opinion_direction": row["opinion_direction"],
            }
            for k in range(config.num_generations)
        ]
    return inputs


def to_record(output: dict, model: str, config: GenerateConfig) -> dict:
    """One row of generated.parquet: the conversation, the completion and how it was made."""
    return {
        "session_id": output["session_id"],
        "step_index": output["step_index"],
        "participant_id": output["participant_id"],
        "generation_index": output["generation_index"],
        "prompt": [
            {"role": "system", "content": output["system_prompt"]},
            {"role": "user", "content": output["instruction"]},
        ],
        "completion": output["generation"],
        "gold_index": output["gold_index"],
        "n_options": output["n_options"],
        "opinion_direction": output["opinion_direction"],
        "model": model,
        "temperature": config.temperature,
        "max_new_tokens": config.max_new_tokens,
        "template": config.template or "grail.tasks.slate.prompts",
    }


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
    parsed = sum(r["parsed_answer"] is not None for r in records)
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
