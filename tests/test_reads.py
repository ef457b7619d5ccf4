"""Does a system read? The swaps behind ``reads_viewer`` and ``reads_options``
(:mod:`grail.tasks.slate.benchmark.reads`) take away exactly what they say, a reader's score
moves and a position rule's does not, and every benchmark reports both for each local model and
the ranker."""

from __future__ import annotations

import json

from grail.benchmark.stage import run
from grail.tasks.slate.benchmark.reads import reads, swap_options, swap_viewers
from grail.tasks.slate.contract import read_dataset
from grail.tasks.slate.prompts import build_user_prompt


def validation(clean) -> list[dict]:
    return read_dataset(clean, split="validation").to_pylist()


def session(row: dict) -> list[str]:
    """The prompt's blocks that are not the viewer's."""
    keep = ("CURRENTLY WATCHING", "RECENTLY WATCHED", "OPTIONS")
    return [b for b in build_user_prompt(row).split("\n\n") if b.startswith(keep)]


def test_the_viewer_swap_changes_the_viewer_lines_and_nothing_else(small_clean):
    rows = validation(small_clean)
    swapped = swap_viewers(rows, seed=3)
    own = {(r["issue"], r["participant_id"]): (r["viewer"], r["opinion_before"]) for r in rows}
    moved = 0
    for row, new in zip(rows, swapped, strict=True):
        assert {k: v for k, v in new.items() if k not in ("viewer", "opinion_before")} == {
            k: v for k, v in row.items() if k not in ("viewer", "opinion_before")
        }
        assert (new["viewer"], new["opinion_before"]) in [
            v for (issue, _), v in own.items() if issue == row["issue"]
        ]  # another participant's of the same issue
        moved += new["viewer"] != own[(row["issue"], row["participant_id"])][0]
        for shown, asked in zip(session(row), session(new), strict=True):
            assert shown == asked  # what they watch, watched and are offered
    assert moved > 0.95 * len(rows)  # only twins (identical answers) keep their lines
    # every row of one participant gets the same other participant's lines
    donors = {}
    for row, new in zip(rows, swapped, strict=True):
        donors.setdefault(row["participant_id"], new["viewer"])
        assert donors[row["participant_id"]] == new["viewer"]


def test_the_options_swap_keeps_positions_and_the_chosen_position(small_clean):
    rows = validation(small_clean)
    swapped = swap_options(rows, seed=1)
    slates = [json.dumps(r["slate"], sort_keys=True) for r in rows]
    for row, new in zip(rows, swapped, strict=True):
        assert new["gold_index"] == row["gold_index"] and new["n_options"] == row["n_options"]
        assert len(new["slate"]) == row["n_options"]
        assert new["gold_id"] == new["slate"][new["gold_index"] - 1]["id"]
        assert json.dumps(new["slate"], sort_keys=True) in slates  # another row's slate
        assert new["viewer"] == row["viewer"] and new["history"] == row["history"]
    assert sum(a["slate"] != b["slate"] for a, b in zip(rows, swapped, strict=True)) > 0.95 * len(
        rows
    )


def test_a_reader_scores_above_zero_and_a_position_rule_scores_zero(small_clean):
    """The study's own rule (the viewer's initial viewpoint times each video's slant) loses
    likelihood when the viewer lines move and when the options move; a rule on positions alone
    does not move at all."""
    import numpy as np

    from grail.tasks.slate.benchmark.systems import load_slants

    rows = read_dataset(small_clean).to_pylist()  # both splits: more participants
    slants = load_slants(small_clean, None)

    def reader(row):
        stance = 2 * row["opinion_before"] - 1
        utility = np.array([4 * stance * slants[item["id"]] for item in row["slate"]])
        utility[0] += 1.2
        weights = np.exp(utility - utility.max())
        return list(weights / weights.sum())

    def by_position(row):
        n = row["n_options"]
        return [0.5] + [0.5 / (n - 1)] * (n - 1)

    shown = [reader(r) for r in rows]
    for swap in (swap_viewers, swap_options):
        swapped = swap(rows)
        moved = reads(shown, [reader(r) for r in swapped], rows, 200)
        assert moved["ci"][0] > 0.1, (swap.__name__, moved)
        fixed = reads([by_position(r) for r in rows], [by_position(r) for r in swapped], rows, 200)
        assert fixed["difference"] == 0 and fixed["ci"] == [0, 0]


def test_every_benchmark_says_whether_each_model_and_the_ranker_read(
    tiny_policy, small_clean, tmp_path
):
    result = run(
        small_clean, tmp_path / "bench", models=[str(tiny_policy)], limit=24, max_new_tokens=8,
        reads_rows=20,
    )  # fmt: skip
    model = result["systems"][tiny_policy.name]
    ranker = result["systems"]["ranker"]
    for entry in (model, ranker):
        for name in ("viewer", "options"):
            assert entry[f"reads_{name}_rows"] == 20
            low, high = entry[f"reads_{name}_ci_low"], entry[f"reads_{name}_ci_high"]
            assert low <= entry[f"reads_{name}"] <= high
    assert ranker["reads_options"] > 0  # the ranker reads the videos' features
    assert "always_first" in result["systems"]
    assert "reads_viewer" not in result["systems"]["always_first"]
    report = (tmp_path / "bench" / "report.md").read_text()
    assert "## Does it read?" in report and f"| {tiny_policy.name} | model |" in report
    none = run(
        small_clean, tmp_path / "none", models=[str(tiny_policy)], limit=10, max_new_tokens=8,
        reads_rows=0,
    )  # fmt: skip
    assert "reads_viewer" not in none["systems"][tiny_policy.name]
