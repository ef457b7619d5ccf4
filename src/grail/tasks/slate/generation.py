"""The slate task's part of ``grail generate``: each row's prompt (the training prompt, options
shuffled when asked, or a Jinja template's), scored by the accuracy and format rewards; the
correct replies become SFT conversations (rejection sampling), correct/wrong pairs of a prompt
preference pairs."""

from __future__ import annotations

import itertools
from pathlib import Path

from grail.core.errors import GrailError
from grail.core.rewards import completion_text, resolve_rewards
from grail.tasks import Generation


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


def render_user_prompt(row: dict, options, template, template_path) -> str:
    from grail.tasks.slate.prompts import build_user_prompt

    if template is None:
        return build_user_prompt(row, options)
    import jinja2

    try:
        return template.render(row=row)
    except jinja2.UndefinedError as err:
        raise GrailError(f"{template_path}: {err.message}") from None


def inputs(data, config, options) -> list[dict]:
    """distilabel's inputs: each row's prompt (options shuffled when asked), num_generations
    times, with what scoring needs carried along."""
    from grail.tasks.slate.contract import read_dataset
    from grail.tasks.slate.prompts import PromptOptions, shuffle_slate, system_prompt

    options = options or PromptOptions()
    rows = read_dataset(data, split=config.split).to_pylist()[: config.limit]
    jinja = load_template(config.template)
    system = system_prompt(options)
    made = []
    for row in rows:
        shown = (
            shuffle_slate(row, options.shuffle_seed) if options.shuffle_seed is not None else row
        )
        instruction = render_user_prompt(shown, options, jinja, config.template)
        made += [
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
    return made


def record(output: dict, model: str, config) -> dict:
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


def score(records: list[dict], reward_names: list[str], weights: list[float] | None) -> None:
    """Add the parsed answer, each reward and the weighted total to every record, in place."""
    from grail.tasks.slate.rewards import REWARDS, parse_answer

    funcs, normalized = resolve_rewards(reward_names, weights, REWARDS)
    prompts = [r["prompt"] for r in records]
    completions = [r["completion"] for r in records]
    columns = {k: [r[k] for r in records] for k in ("gold_index", "n_options", "opinion_direction")}
    for name, func, weight in zip(reward_names, funcs, normalized, strict=True):
        values = func(prompts, completions, **columns)
        for item, value in zip(records, values, strict=True):
            item[f"reward_{name}"] = value
            item["reward"] = item.get("reward", 0.0) + weight * (value or 0.0)
    for item in records:
        item["parsed_answer"] = parse_answer(completion_text(item["completion"]), item["n_options"])
        item["parsed"] = item["parsed_answer"] is not None
        item["correct"] = item["parsed_answer"] == item["gold_index"]


def keep(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """The correct replies as SFT conversations; one (chosen, rejected) pair per wrong reply of
    a prompt that also has a correct one."""
    sft = [
        {
            "session_id": r["session_id"],
            "step_index": r["step_index"],
            "messages": r["prompt"] + [{"role": "assistant", "content": r["completion"]}],
        }
        for r in records
        if r["correct"]
    ]
    by_prompt: dict[tuple, list[dict]] = {}
    for item in records:
        by_prompt.setdefault((item["session_id"], item["step_index"]), []).append(item)
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
    return sft, pairs


def schemas():
    """sft.parquet's and preferences.parquet's schemas (written even when empty)."""
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    ids = [("session_id", pa.string()), ("step_index", pa.int64())]
    sft = pa.schema([*ids, ("messages", pa.list_(message))])
    pairs = pa.schema(
        [*ids, *((name, pa.list_(message)) for name in ("prompt", "chosen", "rejected"))]
    )
    return sft, pairs


GENERATION = Generation(
    rewards=("accuracy", "format"),
    inputs=inputs,
    record=record,
    score=score,
    keep=keep,
    schemas=schemas,
)
