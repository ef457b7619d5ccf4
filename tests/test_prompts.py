"""Prompt builder: section order, identical option format, knobs, seeded shuffle."""

from __future__ import annotations

import re
from itertools import pairwise

from grail.cli import main
from grail.tasks.slate.contract import read_dataset
from grail.tasks.slate.prompts import (
    PromptOptions,
    build_user_prompt,
    shuffle_slate,
    system_prompt,
    to_example,
)

OPTION_LINE = re.compile(
    r"^\d+\. .+ \(from .+\) \| (\d+:\d\d|\?:\?\?) \| \S+ views \| \S+ likes \| \S+ comments$"
)


def _row(default_clean, k=0):
    return read_dataset(default_clean, split="train").slice(k, 1).to_pylist()[0]


def _deep_row(default_clean):
    table = read_dataset(default_clean, split="train")
    k = next(i for i, n in enumerate(table["step_index"].to_pylist()) if n == 3)
    return table.slice(k, 1).to_pylist()[0]


def test_sections_come_in_the_documented_order(default_clean):
    text = build_user_prompt(_deep_row(default_clean))
    heads = [
        "VIEWER",
        "Initial Viewpoint:",
        "CURRENTLY WATCHING",
        "RECENTLY WATCHED (NEWEST LAST)",
        "SURVEY HIGHLIGHTS",
        "OPTIONS",
    ]
    positions = [text.index(h) for h in heads]
    assert positions == sorted(positions)
    blocks = text.split("\n\n")
    assert [b.split("\n")[0].split(" ")[0] for b in blocks] == [
        "VIEWER",
        "Initial",
        "CURRENTLY",
        "RECENTLY",
        "SURVEY",
        "OPTIONS",
    ]
    assert len(blocks[0].split("\n")) == 2  # one line of profile fragments


def test_every_option_has_the_same_format_even_with_missing_fields(default_clean):
    table = read_dataset(default_clean, split="validation").slice(0, 300).to_pylist()
    assert any(o["likes"] is None for r in table for o in r["slate"])
    for row in table:
        options = build_user_prompt(row).split("OPTIONS\n")[1].split("\n")
        assert len(options) == row["n_options"]
        for line in options:
            assert OPTION_LINE.match(line), line


def test_history_depth_show_ids_and_missing_viewer(default_clean):
    row = _deep_row(default_clean)
    assert len(row["history"]) == 3
    recent = build_user_prompt(row, PromptOptions(history_depth=1))
    watched = recent.split("RECENTLY WATCHED (NEWEST LAST)\n")[1].split("\n\n")[0]
    assert watched.count("\n") == 0 and row["history"][-1]["title"] in watched
    everything = build_user_prompt(row, PromptOptions(history_depth=0))
    assert everything.split("RECENTLY WATCHED (NEWEST LAST)\n")[1].split("\n\n")[0].count("\n") == 2
    assert f"[{row['slate'][0]['id']}]" in build_user_prompt(row, PromptOptions(show_ids=True))
    assert row["slate"][0]["id"] not in build_user_prompt(row)
    bare = build_user_prompt(row | {"viewer": None, "opinion_before": None, "history": []})
    assert "VIEWER\nno profile information" in bare and "SURVEY HIGHLIGHTS" not in bare
    assert "Initial Viewpoint" not in bare and "(none)" in bare


def test_seeded_shuffle_remaps_gold_and_is_reproducible(default_clean):
    moved = 0
    rows = read_dataset(default_clean, split="train").slice(0, 200).to_pylist()  # one read
    for row in rows:
        a, b = shuffle_slate(row, 5), shuffle_slate(row, 5)
        assert a == b
        assert a["slate"][a["gold_index"] - 1]["id"] == row["gold_id"]
        assert sorted(o["id"] for o in a["slate"]) == sorted(o["id"] for o in row["slate"])
        moved += a["gold_index"] != row["gold_index"]
    assert moved > 50
    example = to_example(row, PromptOptions(shuffle_seed=5))
    assert example["gold_index"] == shuffle_slate(row, 5)["gold_index"]
    assert [m["role"] for m in example["prompt"]] == ["system", "user"]


def test_system_prompt_asks_for_the_answer_format():
    assert "<answer></answer>" in system_prompt()
    assert "<opinion>" in system_prompt(PromptOptions(opinion=True))
    assert "<opinion>" not in system_prompt()


def test_prompt_command_prints_one_row(default_clean, capsys):
    assert main(["prompt", str(default_clean), "--row", "3", "--split", "validation"]) == 0
    out = capsys.readouterr().out
    assert "=== system ===" in out and "OPTIONS\n1. " in out and "=== gold ===" in out
    assert main(["prompt", str(default_clean), "--row", "99999999"]) == 2
    assert "out of range" in capsys.readouterr().err


def test_training_and_the_benchmark_show_every_option_whole_on_the_demo_s_slates(
    small_clean, tiny_policy
):
    """Every option's title, channel and counts reach the model whole, in the prompt training
    builds from the demo's recipe and in the one the benchmark asks: nothing truncated, every
    prompt within the cloning's sequence length and the tiny policy's positions."""
    from pathlib import Path

    from transformers import AutoConfig, AutoTokenizer

    from grail.tasks.slate.benchmark.systems import PROMPT_DEFAULTS, ask
    from grail.tasks.slate.examples import examples, prompt_record
    from grail.tasks.slate.prompts import render_option
    from grail.train.config import parse_train_args
    from grail.train.sft import OptionLines

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "tiny" / "config_grpo.yaml"
    config, _ = parse_train_args(["--config", str(recipe), "--dataset", str(small_clean)])
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    lines = OptionLines(tokenizer)
    positions = AutoConfig.from_pretrained(tiny_policy).max_position_embeddings
    for split in ("train", "validation"):
        rows = read_dataset(small_clean, split=split).to_pylist()
        trained = [e["prompt"] for e in examples(config, small_clean, split, None)]
        _, asked = ask(rows, PROMPT_DEFAULTS | prompt_record(config))
        assert trained == asked  # the benchmark asks as training asked
        for row, prompt in zip(rows, trained, strict=True):
            user = prompt[-1]["content"]
            for k, item in enumerate(row["slate"], start=1):
                assert render_option(k, item) in user.split("OPTIONS\n", 1)[1].splitlines()
            text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert len(ids) + config.max_completion_length <= min(config.sft_max_length, positions)
            # cloning's option scores (sft_option_score_weight) read each line where it ends
            ends = lines(ids, row["n_options"])
            # (each a line's last token: the next line starts after its line break)
            spans = [ids[: ends[0] + 1]] + [ids[a + 2 : b + 1] for a, b in pairwise(ends)]
            for k, (item, span) in enumerate(zip(row["slate"], spans, strict=True)):
                line = tokenizer.decode(span)
                assert line.endswith(render_option(k + 1, item)), line
                assert k == 0 or line == render_option(k + 1, item), line
