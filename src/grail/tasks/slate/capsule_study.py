"""``grail simulate --layout capsule``: a synthetic study laid out as the published capsule.

The study is simulated in grail's own layout first (so its sessions, clicks and truth are the
same as ``--layout grail`` with the same seed), then rewritten with the capsule's folders, file
names and survey columns (see :mod:`grail.tasks.slate.capsule`). Participants are made to fail each
inclusion rule in known numbers, and ``truth.json`` gives, per study, how many participants a clean
must keep (``expected_participants_kept``) and how many fail each rule.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np

from grail.core.outputs import work_folder
from grail.tasks.slate.capsule import SESSIONS, STUDY_FILES
from grail.tasks.slate.policy_issues import ISSUES

# Shares of surveyed participants made to fail one rule each (attention checks come from the
# study's own attention-check failures).
RULE_SHARES = {
    "survey_too_short": 0.03,
    "index_out_of_range": 0.02,
    "control_arm": 0.05,
    "missing_arm": 0.02,
}
DUPLICATE_SHARE = 0.01  # an extra, later survey row (a second urlid) for the same person
METADATA_COLUMNS = {  # grail's video_metadata.csv column -> the capsule's prefixed column
    "id": "video_id",
    "title": "videoTitle",
    "channel": "videoChannel",
    "duration": "videoDuration",
    "views": "videoViewCount",
    "likes": "videoLikeCount",
    "comments": "videoCommentCount",
}
WAVE1_ONLY = ("q87", "q89", "survey_time", "gun_index")


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _write(path: Path, rows: list[dict], columns: list[str] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = columns or list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def capsule_row(row: dict, study, rng: np.random.Generator, started: int) -> tuple[dict, str]:
    """A survey row with the capsule's columns, and the rule it was made to fail ("" if none)."""
    out = {k: v for k, v in row.items() if k != "attention_check"}
    out |= {"q87": "Quick and easy", "q89": "wikiHow", "survey_time": str(rng.integers(300, 1800))}
    out |= {"treatment_arm": str(rng.choice(["pi", "ai", "pc", "ac"])), "pro": "1", "anti": "0"}
    out["start_time"] = str(started)
    if study.attention and row.get("attention_check") == "fail":
        out["q89"] = str(rng.choice(["Google", "Wikipedia"]))
        return out, "failed_attention_check"
    if study.index_column:  # the simulated population itself has people near the poles
        low, high = study.index_range
        if not low <= float(row[study.index_column]) <= high:
            return out, "index_out_of_range"
    rules = [r for r in RULE_SHARES if study.index_column or r != "index_out_of_range"]
    rules = [r for r in rules if study.attention or r != "survey_too_short"]
    draw, edge = rng.random(), 0.0
    for rule in rules:
        edge += RULE_SHARES[rule]
        if draw < edge:
            if rule == "survey_too_short":
                out["survey_time"] = str(rng.integers(30, 120))
            elif rule == "index_out_of_range":
                low, high = study.index_range
                out[study.index_column] = str(
                    round(low / 2 if rng.random() < 0.5 else (1 + high) / 2, 4)
                )
            elif rule == "control_arm":
                out["treatment_arm"] = "control"
            else:
                out[str(rng.choice(["pro", "anti"]))] = ""
            return out, rule
    return out, ""


def first_sessions(sessions: list[dict]) -> dict[str, str]:
    """urlid -> the id of its earliest session."""
    first: dict[str, tuple[float, str]] = {}
    for s in sessions:
        start = min(
            (t for t in s.get("vidStartTimes") or [] if t is not None), default=float("inf")
        )
        if s["urlid"] not in first or start < first[s["urlid"]][0]:
            first[s["urlid"]] = (start, s["sessionID"])
    return {urlid: sid for urlid, (_, sid) in first.items()}


def write_surveys(ours: Path, out: Path, rng: np.random.Generator, sessions: list[dict]) -> dict:
    """The capsule's survey files; returns per study the participants kept and the failures."""
    steps = _read(ours / "truth_steps.csv")
    clickable = {s["session_id"] for s in steps if s["gold_in_slate"] == "True"}
    first = first_sessions(sessions)
    clock = 1_560_000_000_000
    summary = {}
    for study in STUDY_FILES:
        rows, failures, kept = [], Counter(), 0
        for row in _read(ours / "surveys" / f"{study.name}.csv"):
            clock += int(rng.integers(1000, 100_000))
            converted, reason = capsule_row(row, study, rng, clock)
            if reason:
                failures[reason] += 1
            elif first.get(row["urlid"]) in clickable:
                kept += 1
            rows.append(converted)
            if not reason and rng.random() < DUPLICATE_SHARE:  # took the survey again, later
                again = dict(converted) | {"urlid": f"{converted['urlid']}x"}
                again["start_time"] = str(clock + int(rng.integers(10**6, 10**8)))
                rows.append(again)
                failures["duplicate_participant"] += 1
        if study.wave1 is not None:  # study 1: wave-1 answers in their own file
            ids = [study.id_column]
            _write(
                out / study.wave1,
                [{k: r[k] for k in ids + list(WAVE1_ONLY)} | _profile(r) for r in rows],
            )
            follow = [{k: v for k, v in r.items() if k not in WAVE1_ONLY} for r in rows]
            _write(out / study.survey, follow)
        else:
            _write(out / study.survey, rows)
        summary[study.name] = {"expected_participants_kept": kept, "excluded": dict(failures)}
    return summary


def _profile(row: dict) -> dict:
    """Wave-1 survey answers that are not inclusion fields (demographics, issue items)."""
    skip = {"urlid", "treatment_arm", "pro", "anti", "start_time", "gun_index_2", "worker_id"}
    return {k: v for k, v in row.items() if k not in skip and k not in WAVE1_ONLY}


def to_capsule(ours: Path, out: Path, seed: int) -> dict:
    """Rewrite a study in grail's layout (`ours`) as a capsule under `out`; returns the truth."""
    rng = np.random.default_rng([seed, 2025])  # its own stream: the study itself is unchanged
    data = out / "data"
    (data / SESSIONS).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ours / "sessions.json", data / SESSIONS)
    sessions = json.loads((ours / "sessions.json").read_text())
    for issue, folder in ((i.key, i.capsule_trees) for i in ISSUES.values()):
        for tree in sorted((ours / "trees" / issue).glob("*.csv")):
            target = data / "recommendation trees" / folder / tree.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree, target)
    metadata = [
        {METADATA_COLUMNS[k]: v for k, v in row.items()}
        for row in _read(ours / "video_metadata.csv")
    ]
    _write(data / "supplemental" / "metadata and ratings" / "metadata.csv", metadata)
    studies = write_surveys(ours, out, rng, sessions)
    truth = json.loads((ours / "truth.json").read_text())
    for name, counts in studies.items():
        truth["studies"][name] |= counts
    truth["layout"] = "capsule"
    for name in ("truth.json", "truth_steps.csv"):
        shutil.copyfile(ours / name, out / name)
    (out / "truth.json").write_text(json.dumps(truth, indent=2, sort_keys=True) + "\n")
    return truth


def simulate_capsule(
    out: str | Path, participants: int | None = None, seed: int = 7, choices: str = "study"
) -> dict:
    """The synthetic study in the capsule's layout; `participants`, `seed` and `choices` as
    :func:`grail.tasks.slate.simulate.simulate`."""
    from grail.core.errors import GrailError
    from grail.core.outputs import atomic_folder
    from grail.tasks.slate.simulate import simulate

    if participants is not None and participants < 1:
        raise GrailError(f"participants: expected at least 1, got {participants}")
    with (
        atomic_folder(out, "simulate --layout capsule") as staging,
        work_folder("simulate") as tmp,
    ):
        simulate(Path(tmp) / "study", participants=participants, seed=seed, choices=choices)
        return to_capsule(Path(tmp) / "study", staging, seed)
