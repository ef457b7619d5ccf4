"""The audit: baselines, and detectors that catch upstream-style leakage, not human habits."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from grail.cli import main
from grail.tasks.slate.audit import (
    audit_table,
    metadata_leakage,
    position_baselines,
    position_leakage,
)
from grail.tasks.slate.contract import SCHEMA

FULL = {
    "id": "x",
    "title": "t",
    "channel": "c",
    "duration_seconds": 60,
    "views": 5,
    "likes": 1,
    "comments": 1,
}


def _table(gold_and_slates, issue="gun_control", study="study1"):
    rows = []
    for k, (gold, slate) in enumerate(gold_and_slates):
        slate = [FULL | {"id": f"v{k}_{j}"} | item for j, item in enumerate(slate)]
        rows.append(
            {
                "participant_id": f"p{k % 40}",
                "session_id": f"s{k}",
                "study": study,
                "issue": issue,
                "step_index": 0,
                "current_video": None,
                "history": [],
                "slate": slate,
                "gold_index": gold,
                "gold_id": slate[gold - 1]["id"],
                "n_options": len(slate),
                "viewer": None,
                "opinion_before": None,
                "opinion_after": None,
                "opinion_direction": None,
                "split": "train",
            }
        )
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def test_upstream_style_appended_gold_is_flagged_high():
    # Upstream appended the gold last when it was missing: slates of 4 plus an extra 5th option.
    rows = [(5, [{}] * 5)] * 90 + [(2, [{}] * 4)] * 10
    audit = audit_table(_table(rows))
    found = audit["groups"]["all"]["detectors"]["position_leakage"]
    assert found["severity"] == "high" and "position 5 of 5" in found["evidence"]
    assert audit["leakage"] and audit["leakage"][0].startswith("all: position_leakage high")


def test_human_first_slot_preference_is_reported_but_not_leakage():
    rows = [(1, [{}] * 4)] * 45 + [(2, [{}] * 4)] * 20 + [(3, [{}] * 4)] * 20 + [(4, [{}] * 4)] * 15
    found = audit_table(_table(rows))["groups"]["all"]["detectors"]["position_leakage"]
    assert found["severity"] == "none" and found["position_preference"] is True


def test_a_fixed_position_of_65_percent_is_a_warning():
    rows = [(3, [{}] * 4)] * 70 + [(1, [{}] * 4)] * 30
    assert (
        position_leakage(*zip(*[(g, len(s)) for g, s in rows], strict=True))["severity"]
        == "warning"
    )


def test_gold_formatted_differently_is_metadata_leakage():
    bare = {"channel": None, "duration_seconds": None}
    leaky = [(k % 4 + 1, [bare if j == k % 4 else {} for j in range(4)]) for k in range(80)]
    found = audit_table(_table(leaky))["groups"]["all"]["detectors"]["metadata_leakage"]
    assert found["severity"] == "high"
    assert found["missing_rate"]["channel"] == {"gold": 1.0, "others": 0.0}


def test_random_missingness_is_not_metadata_leakage():
    bare = {"likes": None}
    rows = [(k % 4 + 1, [bare if j == (k * 7) % 4 else {} for j in range(4)]) for k in range(200)]
    found = metadata_leakage(*zip(*[(s, g) for g, s in rows], strict=True))
    assert found["severity"] == "none"


def test_baselines_on_a_hand_made_set():
    b = position_baselines([1, 2, 2, 4, 3], [2, 2, 4, 4, 3])
    assert b == {
        "always_first": 0.2,
        "always_last": 0.6,
        "most_frequent_position": {"position": 2, "accuracy": 0.4},
        "expected_random": round((0.5 + 0.5 + 0.25 + 0.25 + 1 / 3) / 5, 4),
    }


def test_groups_are_per_issue_and_study():
    table = pa.concat_tables(
        [_table([(1, [{}] * 3)] * 5), _table([(2, [{}] * 2)] * 4, "minimum_wage", "study3")]
    )
    groups = audit_table(table)["groups"]
    assert list(groups) == ["all", "gun_control/study1", "minimum_wage/study3"]
    assert groups["minimum_wage/study3"]["rows"] == 4
    assert groups["gun_control/study1"]["gold_positions"] == {1: 5}
    assert groups["all"]["slate_sizes"] == {2: 4, 3: 5}


def test_audit_command_prints_a_table_and_writes_json(default_clean, tmp_path, capsys):
    assert (
        main(
            ["audit", str(default_clean / "validation.parquet"), "--json", str(tmp_path / "a.json")]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "| gun_control/study1 |" in printed and "## Leakage detectors" in printed
    report = json.loads((tmp_path / "a.json").read_text())
    assert set(report["groups"]) == {
        "all",
        "gun_control/study1",
        "minimum_wage/study2",
        "minimum_wage/study3",
    }


def test_audit_json_replaces_only_its_own_report(default_clean, tmp_path, capsys):
    """The probe: `grail audit --json` overwrote a user's file, followed a link and wrote
    inside an export. It replaces only a report it wrote (the report says so), in one line
    otherwise, the file whole."""
    data = str(default_clean / "validation.parquet")
    report = tmp_path / "a.json"
    assert main(["audit", data, "--json", str(report)]) == 0
    assert json.loads(report.read_text())["written_by"] == "grail audit"
    assert main(["audit", data, "--json", str(report)]) == 0  # its own: replaced
    mine = tmp_path / "notes.json"
    mine.write_text('{"mine": 1}')
    (tmp_path / "link.json").symlink_to(mine)
    export = tmp_path / "export"
    export.mkdir()
    (export / "manifest.json").write_text('{"files": {}}')
    for target, why in (
        (mine, "did not write it; it is not replaced"),
        (tmp_path / "link.json", "is a link or not a file"),
        (export / "audit.json", "is inside an export"),
    ):
        capsys.readouterr()
        assert main(["audit", data, "--json", str(target)]) == 2
        assert why in capsys.readouterr().err.strip().splitlines()[-1]
    assert mine.read_text() == '{"mine": 1}' and not (export / "audit.json").exists()


@pytest.mark.parametrize("bad", ["missing", "not-parquet"])
def test_audit_rejects_files_outside_the_contract(tmp_path, capsys, bad):
    path = tmp_path / "x.parquet"
    if bad == "not-parquet":
        path.write_text("hello")
    assert main(["audit", str(path)]) == 2
    assert str(path) in capsys.readouterr().err
