"""The published capsule as it is: its layout detected, the paper's inclusion rules applied and
counted by rule, and real-data quirks (URL ids, trees filling metadata, N-recs keys, the wave
join) handled, on a simulated capsule and on small hand-made ones."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest

from grail.clean.stage import clean
from grail.tasks.slate.capsule_study import simulate_capsule
from grail.tasks.slate.contract import read_dataset


def _people_by_study(folder: Path) -> Counter:
    rows = read_dataset(folder, split="train").to_pylist()
    rows += read_dataset(folder, split="validation").to_pylist()
    return Counter(study for study, _ in {(r["study"], r["participant_id"]) for r in rows})


@pytest.fixture(scope="module")
def capsule(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("capsule") / "capsule"
    return out, simulate_capsule(out, participants=900, seed=3)


@pytest.mark.parametrize("entry", ["root", "data"])
def test_a_simulated_capsule_keeps_exactly_the_participants_the_rules_admit(
    capsule, tmp_path, entry
):
    root, truth = capsule
    report = clean(root if entry == "root" else root / "data", tmp_path / "out")
    kept = _people_by_study(tmp_path / "out")
    for name, study in truth["studies"].items():
        assert kept[name] == study["expected_participants_kept"], name
    dropped = report["accounting"]["participants_dropped"]
    for rule in ("failed_attention_check", "survey_too_short", "index_out_of_range"):
        expected = sum(s["excluded"].get(rule, 0) for s in truth["studies"].values())
        assert dropped[rule] == expected > 0, rule
    assert dropped["control_arm"] > 0 and dropped["missing_arm"] > 0
    accounting = report["accounting"]
    assert accounting["rows_in"] == accounting["rows_kept"] + sum(
        accounting["rows_dropped"].values()
    )


def _csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def hand_made(root: Path, shorts: bool = False) -> Path:
    """Two gun-control workers (one fails q89), wage files with one YouGov case."""
    data = root / "data"
    sessions = [
        {  # URL-form ids and "N-recs" keys, as the export writes them
            "sessionID": "s1",
            "urlid": "u1",
            "issue": "gun",
            "vids": ["https://www.youtube.com/watch?v=aaaaaaaaaaa", "bbbbbbbbbbb"],
            "displayOrders": {"1-recs": ["bbbbbbbbbbb", "youtu.be/ccccccccccc"]},
            "vidStartTimes": [1000, 2000],
        },
        {
            "sessionID": "s2",
            "urlid": "u2",
            "issue": "gun",
            "vids": ["aaaaaaaaaaa", "ccccccccccc"],
            "displayOrders": {"1-recs": ["bbbbbbbbbbb", "ccccccccccc"]},
            "vidStartTimes": [1000, 2000],
        },
    ]
    (data / "platform session data").mkdir(parents=True)
    (data / "platform session data" / "sessions.json").write_text(json.dumps(sessions))
    _csv(  # ccccccccccc's title is missing here: the tree fills it
        data / "supplemental" / "metadata and ratings" / "meta.csv",
        [
            {"video_id": v, "videoTitle": t, "videoChannel": "C", "videoViewCount": "10"}
            for v, t in (("aaaaaaaaaaa", "A"), ("bbbbbbbbbbb", "B"), ("ccccccccccc", ""))
        ],
    )
    _csv(
        data / "recommendation trees" / "trees_gun" / "aaaaaaaaaaa.csv",
        [{"originId": "ccccccccccc", "title": "C from the tree", "rec1": "aaaaaaaaaaa"}],
    )
    gun = root / "results" / "intermediate data" / "gun control (issue 1)"
    wave1 = {"q87": "Quick and easy", "survey_time": "300", "pid1": "Democrat"}
    _csv(
        gun / "guncontrol_qualtrics_w1_clean.csv",
        [
            wave1 | {"worker_id": "w1", "q89": "wikiHow", "gun_index": "0.30"},
            wave1 | {"worker_id": "w2", "q89": "Google", "gun_index": "0.40"},
        ],
    )
    follow = {"treatment_arm": "pi", "pro": "1", "anti": "0", "gun_index_2": "0.50"}
    _csv(
        gun / "guncontrol_qualtrics_w123_clean.csv",
        [follow | {"worker_id": "w1", "urlid": "u1"}, follow | {"worker_id": "w2", "urlid": "u2"}],
    )
    wage = root / "results" / "intermediate data" / "minimum wage (issue 2)"
    wage_row = {"treatment_arm": "pi", "pro": "1", "anti": "0", "urlid": "u9"}
    _csv(
        wage / "qualtrics_w12_clean.csv",
        [
            wage_row
            | {
                "worker_id": "w9",
                "q87": "x",
                "q89": "y",
                "survey_time": "1",
                "mw_index_w1": "0.5",
                "mw_index_w2": "0.5",
            }
        ],
    )
    _csv(wage / "yg_w12_clean.csv", [wage_row | {"caseid": "c1", "urlid": "u8"}])
    if shorts:
        (data / "shorts").mkdir()
        (data / "shorts" / "ytrecs_sessions_may2024.rds").write_bytes(b"")
    return root


def test_hand_made_capsule_quirks(tmp_path):
    report = clean(hand_made(tmp_path / "capsule", shorts=True), tmp_path / "out")
    accounting = report["accounting"]
    assert accounting["participants_kept"] == 1
    assert accounting["participants_dropped"] == {"failed_attention_check": 1}
    assert "study4" in accounting["out_of_scope"]
    (row,) = [
        r
        for split in ("train", "validation")
        for r in read_dataset(tmp_path / "out", split=split).to_pylist()
    ]
    assert row["participant_id"] == "w1" and row["study"] == "study1"
    # the wave join: the index before from wave 1, after from the follow-up
    assert (row["opinion_before"], row["opinion_after"]) == (0.30, 0.50)
    assert [item["id"] for item in row["slate"]] == ["bbbbbbbbbbb", "ccccccccccc"]
    assert row["slate"][1]["title"] == "C from the tree"
    assert row["gold_index"] == 1 and row["viewer"]["pid1"] == "Democrat"


def test_a_missing_capsule_survey_file_is_named(tmp_path):
    root = hand_made(tmp_path / "capsule")
    target = root / "results" / "intermediate data" / "minimum wage (issue 2)" / "yg_w12_clean.csv"
    target.unlink()
    with pytest.raises(Exception, match="yg_w12_clean.csv"):
        clean(root, tmp_path / "out")
