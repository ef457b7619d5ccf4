"""Stage clean: the contract, leakage-free slates, participant split, accounting, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from raw_builder import person, session, video, write_raw

from grail.clean.stage import clean
from grail.cli import main
from grail.tasks.slate.clean import split_participants
from grail.tasks.slate.contract import SCHEMA, read_dataset


def _rows(out):
    return (
        read_dataset(out)
        .sort_by([("session_id", "ascending"), ("step_index", "ascending")])
        .to_pylist()
    )


def test_tiny_export_follows_every_rule(tiny_raw, tmp_path):
    report = clean(tiny_raw, tmp_path / "out", validation_fraction=0.0)
    rows = _rows(tmp_path / "out")
    acc = report["accounting"]
    assert acc["rows_in"] == 6 and acc["rows_kept"] == 4
    assert acc["rows_dropped"] == {"duplicate_session": 1, "gold_not_in_slate": 1}
    assert [(r["session_id"], r["step_index"]) for r in rows] == [
        ("s1", 0),
        ("s1", 1),
        ("s2", 0),
        ("s2", 1),
    ]
    # The slate is exactly what was displayed, in order; the gold is never appended.
    assert [[o["id"] for o in r["slate"]] for r in rows] == [
        ["b", "d"],
        ["e", "c", "f"],
        ["b", "c", "d"],
        ["g", "f"],
    ]
    assert [r["gold_index"] for r in rows] == [1, 2, 3, 1]
    assert [r["gold_id"] for r in rows] == ["b", "c", "d", "g"]
    assert [[h["id"] for h in r["history"]] for r in rows] == [[], ["a"], [], ["a"]]
    assert rows[1]["history"][0]["watch_seconds"] == 30.0
    assert rows[0]["current_video"] == {"id": "a", "title": "Title a", "channel": "Channel a"}
    assert [r["opinion_direction"] for r in rows] == ["increase"] * 2 + ["decrease"] * 2
    assert rows[0]["viewer"]["pid1"] == "Democrat" and rows[0]["viewer"]["age"] is None
    assert {r["participant_id"] for r in rows} == {"W1", "W2"}
    assert {r["study"] for r in rows} == {"study1"} and {r["issue"] for r in rows} == {
        "gun_control"
    }
    assert pq.read_schema(tmp_path / "out" / "train.parquet").names == SCHEMA.names


def test_duplicates_keep_the_earliest_session_whatever_the_file_order(tmp_path):
    videos = [video(v) for v in "abcd"]
    sessions = [
        session("late", "u1", ["a", "c"], [["c", "d"]], start=50_000),
        session("early", "u1", ["a", "b", "c"], [["b", "c"], ["c", "d"]], start=10),
    ]
    raw = write_raw(tmp_path / "raw", sessions, [person("W1", "u1")], videos)
    report = clean(raw, tmp_path / "out", validation_fraction=0.0)
    assert {r["session_id"] for r in _rows(tmp_path / "out")} == {"early"}
    assert report["accounting"]["rows_dropped"] == {"duplicate_session": 1}


def test_ids_match_across_case_and_url_prefixes_and_text_is_cleaned(tmp_path):
    videos = [
        video("https://www.youtube.com/watch?v=AbCdE_12345", title="Guns &amp; Laws\n 🔥"),
        video("xYz12-67890", channel=""),
        video("Qq777abcdef"),
    ]
    sessions = [
        session("s", "u1", ["abcde_12345", "yt:XYZ12-67890"], [["QQ777ABCDEF", "xyz12-67890"]])
    ]
    raw = write_raw(tmp_path / "raw", sessions, [person("W1", "u1")], videos)
    clean(raw, tmp_path / "out", validation_fraction=0.0)
    (row,) = _rows(tmp_path / "out")
    assert row["current_video"]["id"] == "AbCdE_12345"
    assert row["current_video"]["title"] == "Guns & Laws 🔥"
    assert [o["id"] for o in row["slate"]] == ["Qq777abcdef", "xYz12-67890"] and row[
        "gold_index"
    ] == 2
    assert row["slate"][1]["channel"] is None


def test_participant_level_drops_are_counted(tmp_path):
    videos = [video(v) for v in "abc"]
    sessions = [
        session("s1", "u1", ["a", "b"], [["b", "c"]]),
        session("s2", "u2", ["a", "b"], [["b", "c"]]),
        session("s3", "u3", ["a", "c"], [["b", "c"]]),
        session("s4", "u4", ["a"], []),
    ]
    survey = [
        person("W1", "u1"),
        person("W2", "u2", attention_check="fail"),
        person("W3", "u3"),
        person("W4", "u4"),
    ]
    report = clean(
        write_raw(
            tmp_path / "raw", sessions + [session("s5", "u5", ["a", "b"], [["b"]])], survey, videos
        ),
        tmp_path / "out",
        validation_fraction=0.0,
    )
    acc = report["accounting"]
    assert acc["participants_in"] == 5 and acc["participants_kept"] == 2
    assert acc["participants_dropped"] == {
        "failed_attention_check": 1,
        "no_steps": 1,
        "no_survey": 1,
    }
    assert acc["rows_dropped"] == {"failed_attention_check": 1, "no_survey": 1}
    assert acc["rows_in"] == acc["rows_kept"] + sum(acc["rows_dropped"].values())


def test_a_survey_without_a_column_a_rule_needs_is_a_counted_warning(tmp_path, capsys):
    """The probe's cases: a survey without attention_check kept people who failed it, one
    without gun_index nulled every opinion, both without a word. The rows are kept (the
    rules cannot be applied), and the audit and the command say so, with counts."""
    videos = [video(v) for v in "abc"]
    sessions = [session(f"s{i}", f"u{i}", ["a", "b"], [["b", "c"]]) for i in range(3)]
    survey = [
        {
            k: v
            for k, v in person(f"W{i}", f"u{i}").items()
            if k not in ("attention_check", "gun_index")
        }
        for i in range(3)
    ]
    raw = write_raw(tmp_path / "raw", sessions, survey, videos)
    assert main(["clean", "--raw", str(raw), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    warnings = json.loads((tmp_path / "out" / "audit.json").read_text())["accounting"]["warnings"]
    warnings = [w for w in warnings if "prompts leave" not in w]  # the profile's: tested below
    assert warnings == [
        "surveys/study1.csv has no attention_check column: 3 kept participants were not "
        "checked for attention",
        "surveys/study1.csv has no gun_index column: 3 kept participants have no opinion index "
        "from it (opinion fields empty)",
    ]
    for warning in warnings:
        assert f"grail clean: warning: {warning}" in captured.err
        assert warning in (tmp_path / "out" / "audit.md").read_text()
    assert read_dataset(tmp_path / "out", split="train").num_rows == 3


def test_every_profile_field_a_survey_lacks_is_a_counted_warning(tmp_path, capsys):
    """Before: a survey without the profile columns was cleaned without a word, and every
    prompt said "no profile information". Each column the prompt's VIEWER line cannot fill is
    a warning with its count (audit and stderr); a study with no profile at all is refused."""
    videos = [video(v) for v in "abc"]
    sessions = [session(f"s{i}", f"u{i}", ["a", "b"], [["b", "c"]]) for i in range(3)]
    survey = [person(f"W{i}", f"u{i}", age="34", ideo1="Liberal") for i in range(3)]
    raw = write_raw(tmp_path / "raw", sessions, survey, videos)
    assert main(["clean", "--raw", str(raw), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    warnings = json.loads((tmp_path / "out" / "audit.json").read_text())["accounting"]["warnings"]
    lacking = sorted(w.split(" column")[0].rsplit(" ", 1)[1] for w in warnings if "prompts" in w)
    assert lacking == sorted(
        ["gender", "race", "income", "pid2", "freq_youtube", "college", "pol_interest"]
        + ["religpew", "newsint"]
    )
    assert (
        "grail clean: warning: surveys/study1.csv has no gender column: 3 kept participants' "
        "prompts leave their gender out"
    ) in err
    bare = [{k: v for k, v in person(f"W{i}", f"u{i}").items() if k != "pid1"} for i in range(3)]
    raw = write_raw(tmp_path / "bare", sessions, bare, videos)
    assert main(["clean", "--raw", str(raw), "--out", str(tmp_path / "out2")]) == 2
    assert "none of the 3 kept participants has any profile field" in capsys.readouterr().err
    assert not (tmp_path / "out2").exists()


def test_an_empty_study_or_one_with_no_row_kept_is_refused(tmp_path, capsys):
    """`sessions.json` = [] was a complete 0-row dataset; everyone excluded was one too."""
    videos = [video(v) for v in "abc"]
    empty = write_raw(tmp_path / "empty", [], [person("W1", "u1")], videos)
    assert main(["clean", "--raw", str(empty), "--out", str(tmp_path / "out1")]) == 2
    assert "sessions.json: no sessions: an empty study" in capsys.readouterr().err
    sessions = [session("s1", "u1", ["a", "b"], [["b", "c"]])]
    failed = write_raw(
        tmp_path / "failed", sessions, [person("W1", "u1", attention_check="fail")], videos
    )
    assert main(["clean", "--raw", str(failed), "--out", str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err
    assert "no row kept of 1 (dropped: failed_attention_check 1)" in err, err
    assert not (tmp_path / "out1").exists() and not (tmp_path / "out2").exists()


def test_default_study_meets_the_contract_split_and_audit(default_clean):
    audit = json.loads((default_clean / "audit.json").read_text())
    acc = audit["accounting"]
    assert acc["rows_in"] == acc["rows_kept"] + sum(acc["rows_dropped"].values())
    assert acc["participants_in"] == acc["participants_kept"] + sum(
        acc["participants_dropped"].values()
    )
    assert set(acc["rows_dropped"]) == {
        "duplicate_session",
        "failed_attention_check",
        "gold_not_in_slate",
        "no_survey",
    }
    train = read_dataset(default_clean / "train.parquet")
    validation = read_dataset(default_clean / "validation.parquet")
    train_people = set(train["participant_id"].to_pylist())
    validation_people = set(validation["participant_id"].to_pylist())
    assert not train_people & validation_people
    share = len(validation_people) / (len(train_people) + len(validation_people))
    assert 0.09 <= share <= 0.11
    assert set(train["split"].to_pylist()) == {"train"}
    assert set(validation["split"].to_pylist()) == {"validation"}
    assert audit["leakage"] == []
    for group in audit["groups"].values():
        for found in group["detectors"].values():
            assert found["severity"] == "none"
    assert (default_clean / "audit.md").read_text().startswith("# Data audit")


def test_split_is_seeded_by_participant():
    ids = [f"p{i}" for i in range(500)] * 3
    first = split_participants(ids, 0.2, seed=1)
    assert first == split_participants(list(reversed(ids)), 0.2, seed=1)
    assert first != split_participants(ids, 0.2, seed=2)
    assert sum(v == "validation" for v in first.values()) == 100


def _corrupt(raw, name, text):
    (raw / name).write_text(text)
    return raw


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (
            lambda raw: _corrupt(raw, "sessions.json", '[{"sessionID": "s1", '),
            "sessions.json: malformed JSON at line 1",
        ),
        (
            lambda raw: _corrupt(raw, "sessions.json", '[{"sessionID": "s1", "issue": "gun"}]'),
            "sessions.json: session 0, field urlid: missing required field",
        ),
        (
            lambda raw: _corrupt(
                raw, "sessions.json", json.dumps([session("s1", "u1", "a b", [])])
            ),
            "session 0 (s1), field vids: expected a list",
        ),
        (
            lambda raw: _corrupt(
                raw, "sessions.json", json.dumps([session("s1", "u1", ["a", "b"], [["b", "zzz"]])])
            ),
            "session 0 (s1), field displayOrders[0][1]: unknown video id 'zzz'",
        ),
        (
            lambda raw: _corrupt(raw, "video_metadata.csv", "id,title,views\na,A,12\nb,B,lots\n"),
            "video_metadata.csv: line 3, field views: expected a number, got 'lots'",
        ),
        (
            lambda raw: _corrupt(raw, "surveys/study1.csv", "worker_id,gun_index\nW1,0.2\n"),
            "study1.csv: field urlid: missing required column",
        ),
        (
            lambda raw: _corrupt(
                raw, "surveys/study1.csv", "worker_id,urlid,gun_index\nW1,u1,1.7\nW2,u2,0.1\n"
            ),
            "study1.csv: participant W1, field gun_index: expected a number on [0, 1]",
        ),
        (
            lambda raw: (raw / "video_metadata.csv").unlink() or raw,
            "no video_metadata.csv found below this folder",
        ),
    ],
)
def test_bad_input_is_one_clear_line_and_a_nonzero_exit(
    tiny_raw, tmp_path, capsys, damage, expected
):
    raw = damage(tiny_raw)
    code = main(["clean", "--raw", str(raw), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_corrupt_sessions_file_through_the_installed_command(tiny_raw, tmp_path):
    (tiny_raw / "sessions.json").write_text("{not json")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grail.cli",
            "clean",
            "--raw",
            str(tiny_raw),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert str(tiny_raw / "sessions.json") in done.stderr and "Traceback" not in done.stderr
    debug = subprocess.run(
        [
            sys.executable,
            "-m",
            "grail.cli",
            "--debug",
            "clean",
            "--raw",
            str(tiny_raw),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_one_person_under_two_urlids_keeps_only_their_earliest_session(tmp_path):
    raw = write_raw(
        tmp_path / "raw",
        [
            session("late", "u2", ["a", "b"], [["b", "c"]], start=9000),
            session("early", "u1", ["a", "c"], [["c", "b"]], start=1000),
        ],
        [person("w1", "u1"), person("w1", "u2")],  # the same worker took the study twice
        [video(v) for v in "abc"],
    )
    report = clean(raw, tmp_path / "out")
    accounting = report["accounting"]
    assert accounting["participants_in"] == 1 and accounting["participants_kept"] == 1
    assert accounting["rows_dropped"] == {"duplicate_session": 1}
    rows = (
        pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
        + pq.read_table(tmp_path / "out" / "validation.parquet").to_pylist()
    )
    assert [r["session_id"] for r in rows] == ["early"]


def test_a_video_listed_twice_in_a_slate_is_shown_once_and_counted(tmp_path):
    raw = write_raw(
        tmp_path / "raw",
        [session("s1", "u1", ["a", "c"], [["b", "c", "B", "c"]])],  # B: the same video as b
        [person("w1", "u1")],
        [video(v) for v in "abc"],
    )
    report = clean(raw, tmp_path / "out")
    rows = [
        r
        for split in ("train", "validation")
        for r in pq.read_table(tmp_path / "out" / f"{split}.parquet").to_pylist()
    ]
    assert [item["id"] for item in rows[0]["slate"]] == ["b", "c"]
    assert rows[0]["gold_index"] == 2 and rows[0]["n_options"] == 2
    assert report["accounting"]["repairs"] == {"duplicate_slate_items": 2}


@pytest.mark.parametrize("keys", [("1-recs", "2-recs"), ("0", "1")])
def test_display_order_keys_count_from_their_own_base(tmp_path, keys):
    raw = write_raw(
        tmp_path / "raw",
        [session("s1", "u1", ["a", "b", "c"], {keys[0]: ["b", "c"], keys[1]: ["c", "a"]})],
        [person("w1", "u1")],
        [video(v) for v in "abc"],
    )
    report = clean(raw, tmp_path / "out")
    assert report["accounting"]["rows_kept"] == 2  # both steps found their slates
