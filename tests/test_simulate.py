"""The synthetic study: shape, known truth, determinism."""

from __future__ import annotations

import csv
import hashlib
import json
from collections import Counter

import numpy as np
import pyarrow as pa

from grail.tasks.slate.contract import read_dataset
from grail.tasks.slate.simulate import simulate
from grail.tasks.slate.world import ChoiceModel


def _digest(folder) -> dict[str, str]:
    """Every file's sha256; the marker's without the folder it names (its claim on that one)."""
    found = {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "_COMPLETE.json"
    }
    marker = json.loads((folder / "_COMPLETE.json").read_text())
    assert marker.pop("folder") == str(folder.resolve())
    return found | {"_COMPLETE.json": json.dumps(marker, sort_keys=True)}


def test_same_seed_same_bytes_and_other_seed_differs(tmp_path):
    simulate(tmp_path / "a", participants=120, seed=3)
    simulate(tmp_path / "b", participants=120, seed=3)
    simulate(tmp_path / "c", participants=120, seed=4)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert _digest(tmp_path / "a")["sessions.json"] != _digest(tmp_path / "c")["sessions.json"]


def test_layout_and_default_sizes(default_study):
    for name in (
        "sessions.json",
        "video_metadata.csv",
        "truth.json",
        "truth_steps.csv",
        "surveys/study1.csv",
        "surveys/study2.csv",
        "surveys/study3.csv",
    ):
        assert (default_study / name).is_file(), name
    assert list((default_study / "trees" / "gun_control").glob("*.csv"))
    assert list((default_study / "trees" / "minimum_wage").glob("*.csv"))
    sessions = json.loads((default_study / "sessions.json").read_text())
    assert 5900 <= len({s["urlid"] for s in sessions}) <= 6100
    steps = sum(len(s["vids"]) - 1 for s in sessions)
    assert 22_000 <= steps <= 26_000
    sizes = Counter(len(slate) for s in sessions for slate in s["displayOrders"].values())
    assert set(sizes) <= {2, 3, 4, 5}
    assert sizes[4] / sum(sizes.values()) > 0.6
    assert max(len(s["vids"]) for s in sessions) == 5  # history of 0-3 videos per step
    with (default_study / "surveys" / "study3.csv").open() as handle:
        assert "caseid" in next(csv.reader(handle))


def test_truth_ceiling_is_exact_and_in_the_target_band(default_study, default_clean):
    truth = json.loads((default_study / "truth.json").read_text())
    with (default_study / "truth_steps.csv").open() as handle:
        steps = list(csv.DictReader(handle))
    kept = {
        (s["session_id"], int(s["step_index"])): float(s["bayes_probability"])
        for s in steps
        if s["kept"] == "True"
    }
    table = read_dataset(default_clean)
    cleaned = set(
        zip(table["session_id"].to_pylist(), table["step_index"].to_pylist(), strict=True)
    )
    assert cleaned == set(kept)  # the cleaner keeps exactly the steps the generator meant to keep
    for name, study in truth["studies"].items():
        rows = table.filter(pa.compute.equal(table["study"], name))
        mine = [
            kept[k]
            for k in zip(
                rows["session_id"].to_pylist(), rows["step_index"].to_pylist(), strict=True
            )
        ]
        assert abs(np.mean(mine) - study["bayes_optimal_accuracy"]) < 1e-6
        assert 0.55 <= study["bayes_optimal_accuracy_by_slate_size"]["4"] <= 0.75
    assert set(truth["choice_model"]) == {"alignment", "momentum", "popularity", "position"}


def test_first_slot_preference_and_opinion_shift_look_like_the_real_study(default_clean):
    table = read_dataset(default_clean)
    rows = table.select(
        ["n_options", "gold_index", "participant_id", "opinion_before", "opinion_after"]
    ).to_pylist()
    four = [r["gold_index"] for r in rows if r["n_options"] == 4]
    assert 0.40 <= four.count(1) / len(four) <= 0.50
    people = {r["participant_id"]: r["opinion_after"] - r["opinion_before"] for r in rows}
    shifts = np.array(list(people.values()))
    assert 0.45 <= np.mean(np.abs(shifts) <= 0.05) <= 0.75
    assert 0.0 < np.mean(np.abs(shifts)) < 0.06


def test_choice_model_is_a_distribution_that_follows_alignment():
    model = ChoiceModel()
    slants = np.array([-1.0, 0.0, 1.0, 0.5])
    pro = model.probabilities(1.0, 0.0, slants, np.zeros(4))
    anti = model.probabilities(-1.0, 0.0, slants, np.zeros(4))
    assert np.isclose(pro.sum(), 1) and np.isclose(anti.sum(), 1)
    assert pro.argmax() == 2 and anti.argmax() == 0
    neutral = model.probabilities(0.0, 0.0, np.zeros(4), np.zeros(4))
    assert neutral.argmax() == 0  # the first-slot preference


def test_a_study_of_no_one_is_refused_in_one_line(tmp_path, error_line):
    """`grail simulate --participants -5` is one line naming the field, nothing written (the
    clean task of `grail run --local` simulates through the same function; how a task's error
    reaches the run's last line: tests/test_local_run.py)."""
    for count in ("0", "-5"):
        line = error_line(["simulate", "--out", str(tmp_path / "raw"), "--participants", count])
        assert line == f"grail: error: participants: expected at least 1, got {count}"
    assert not (tmp_path / "raw").exists()


def test_the_ladder_s_rungs_choose_as_they_say(tmp_path):
    """``--choices marker``: every slate holds one option whose title opens with the marker,
    chosen with probability 0.9 wherever it stands, the catalogue otherwise the study's;
    ``--choices side``: the viewer's party against each video's side, no position effect."""
    import pytest

    from grail.clean.stage import clean
    from grail.core.errors import GrailError
    from grail.tasks.slate.world import MARKER, SIDE_MODEL
    from grail.tasks.summarize.documents import write_study

    study = simulate(tmp_path / "study", participants=60, seed=3)
    marker = simulate(tmp_path / "marker", participants=60, seed=3, choices="marker")
    assert study["choices"] == "study" and marker["choices"] == "marker"
    titles, marked = _titles(tmp_path / "study"), _titles(tmp_path / "marker")
    shared = titles.keys() & marked.keys()
    assert len(shared) > 300
    assert all(marked[v] in (titles[v], f"{MARKER} {titles[v]}") for v in shared)
    assert 0.4 < sum(marked[v].startswith(MARKER) for v in shared) / len(shared) < 0.6
    clean(tmp_path / "marker", tmp_path / "marker_clean")
    positions = Counter()
    for row in read_dataset(tmp_path / "marker_clean").to_pylist():
        marked = [k for k, item in enumerate(row["slate"]) if item["title"].startswith(MARKER)]
        assert len(marked) == 1
        positions[marked[0]] += 1
    assert len(positions) >= 3  # wherever it stands
    steps = _truth_steps(tmp_path / "marker")
    assert {round(max(json.loads(s["choice_probabilities"]).values()), 6) for s in steps
            if int(s["n_options"]) > 1} == {0.9}  # fmt: skip
    simulate(tmp_path / "side", participants=60, seed=3, choices="side")
    slant = json.loads((tmp_path / "side" / "truth.json").read_text())["video_slant"]
    for step in _truth_steps(tmp_path / "side"):
        shares = json.loads(step["choice_probabilities"])
        expected = SIDE_MODEL.probabilities(
            float(step["stance"]), 0.0, np.sign([slant[v] for v in shares]), np.zeros(len(shares))
        )
        assert np.allclose(list(shares.values()), expected, atol=1e-5)
        assert float(step["stance"]) in (-1.0, 0.0, 1.0)
    with pytest.raises(GrailError, match="choices"):
        write_study(tmp_path / "docs", None, 10, 1, "grail", "marker")
    from grail.tasks.slate.counterfactual.stage import load_study

    with pytest.raises(GrailError, match="not the marker rung"):
        load_study(tmp_path / "marker_clean")


def _titles(raw) -> dict[str, str]:
    with (raw / "video_metadata.csv").open() as handle:
        return {r["id"]: r["title"] for r in csv.DictReader(handle)}


def _truth_steps(raw) -> list[dict]:
    with (raw / "truth_steps.csv").open() as handle:
        return list(csv.DictReader(handle))
