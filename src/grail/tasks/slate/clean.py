"""The slate task's cleaning: raw study export -> one row per step, split by participant, with
an audit (the stage is :mod:`grail.clean.stage`).

Writes ``train.parquet`` and ``validation.parquet`` in the contract of
:mod:`grail.tasks.slate.contract`, and ``audit.json`` / ``audit.md`` (see
:mod:`grail.tasks.slate.audit`), and, for a simulated study, copies its ``truth.json`` and
``truth_steps.csv``.

Rules: the slate is exactly what was displayed, in display order; the clicked video is never added
to it, so a step whose next video is not in its slate is dropped (``gold_not_in_slate``). For a
participant with several sessions on one issue only the earliest is kept. Every dropped row and
participant is counted by reason, and ``rows_in == rows_kept + sum(rows_dropped.values())``.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from grail.core.errors import DataError
from grail.core.outputs import atomic_folder
from grail.tasks.slate import audit as audit_module
from grail.tasks.slate.contract import SCHEMA, SPLITS, VIEWER_FIELDS
from grail.tasks.slate.policy_issues import ISSUES
from grail.tasks.slate.prompts import PROFILE_FIELDS
from grail.tasks.slate.raw import (
    Session,
    VideoInfo,
    read_sessions,
    read_surveys,
    read_videos,
    video_key,
)

TRUTH_FILES = ("truth.json", "truth_steps.csv")
FAILED_ATTENTION = {"fail", "failed", "0", "false", "no"}


def opinion_direction(before: float | None, after: float | None, tolerance: float) -> str | None:
    """Direction of the opinion change; a move within `tolerance` is no change.

    >>> opinion_direction(0.40, 0.47, 0.05), opinion_direction(0.40, 0.42, 0.05)
    ('increase', 'no_change')
    """
    if before is None or after is None:
        return None
    delta = after - before
    return "increase" if delta > tolerance else "decrease" if delta < -tolerance else "no_change"


def split_participants(participant_ids: list[str], fraction: float, seed: int) -> dict[str, str]:
    """Seeded split by participant: each participant is in exactly one split.

    >>> s = split_participants(["a", "b", "c", "d"], 0.5, seed=1)
    >>> sorted(s.values())
    ['train', 'train', 'validation', 'validation']
    """
    ids = sorted(set(participant_ids))
    order = np.random.default_rng(seed).permutation(len(ids))
    n_validation = round(fraction * len(ids))
    return {ids[i]: SPLITS[1] if rank < n_validation else SPLITS[0] for rank, i in enumerate(order)}


def _opinion(row: dict[str, str], column: str, survey: Path, line: str) -> float | None:
    raw = row.get(column, "")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise DataError(
            f"expected a number on [0, 1], got {raw!r}", file=survey, row=line, field=column
        ) from None
    if not 0.0 <= value <= 1.0:
        raise DataError(
            f"expected a number on [0, 1], got {raw!r}", file=survey, row=line, field=column
        )
    return value


def viewer_profile(row: dict[str, str]) -> dict[str, str | None]:
    """Profile fields from a survey row; wave-1 columns (``minwage15_w1``) fill the plain names."""
    return {name: row.get(name) or row.get(f"{name}_w1") or None for name in VIEWER_FIELDS}


def _video(
    videos: dict[str, VideoInfo], raw_id: str, path: Path, session: Session, field: str
) -> VideoInfo:
    info = videos.get(video_key(raw_id))
    if info is None:
        raise DataError(
            f"unknown video id {raw_id!r} (not in video_metadata.csv or any tree)",
            file=path,
            row=f"session {session.index} ({session.session_id})",
            field=field,
        )
    return info


def session_rows(
    session: Session,
    videos: dict[str, VideoInfo],
    path: Path,
    drops: Counter,
    repairs: Counter | None = None,
) -> list[dict]:
    """Step rows of one session (without participant fields); dropped steps go to `drops`.

    A video listed twice in one slate (the same id, or ids that differ only in case or prefix)
    is shown once, at its first position; each repair is counted in `repairs`.
    """
    watched = [_video(videos, v, path, session, f"vids[{i}]") for i, v in enumerate(session.vids)]
    rows = []
    for step, slate_ids in enumerate(session.slates):
        if not slate_ids:
            drops["missing_slate"] += 1
            continue
        listed = [
            _video(videos, v, path, session, f"displayOrders[{step}][{j}]")
            for j, v in enumerate(slate_ids)
        ]
        slate = list({item.id: item for item in listed}.values())  # first occurrence order
        if len(slate) < len(listed) and repairs is not None:
            repairs["duplicate_slate_items"] += len(listed) - len(slate)
        gold = watched[step + 1]
        positions = [j for j, item in enumerate(slate) if item.id == gold.id]
        if not positions:
            drops["gold_not_in_slate"] += 1
            continue
        current = watched[step]
        rows.append(
            {
                "session_id": session.session_id,
                "issue": session.issue,
                "step_index": step,
                "current_video": {
                    "id": current.id,
                    "title": current.title,
                    "channel": current.channel,
                },
                "history": [
                    {
                        "id": v.id,
                        "title": v.title,
                        "channel": v.channel,
                        "watch_seconds": session.watch_seconds[i],
                        "total_seconds": session.total_seconds[i]
                        if session.total_seconds[i] is not None
                        else v.duration_seconds,
                    }
                    for i, v in enumerate(watched[:step])
                ],
                "slate": [
                    {
                        "id": v.id,
                        "title": v.title,
                        "channel": v.channel,
                        "duration_seconds": v.duration_seconds,
                        "views": v.views,
                        "likes": v.likes,
                        "comments": v.comments,
                    }
                    for v in slate
                ],
                "gold_index": positions[0] + 1,
                "gold_id": gold.id,
                "n_options": len(slate),
            }
        )
    return rows


def read_people_and_videos(raw: Path, repairs: Counter):
    """Surveys, excluded participants, what is out of scope, and video facts: from the published
    capsule's layout and inclusion rules when `raw` is one, else from grail's own layout."""
    from grail.tasks.slate.capsule import capsule_root, read_capsule_surveys, read_capsule_videos

    root = capsule_root(raw)
    if root is None:
        return read_surveys(raw, repairs), {}, {}, read_videos(raw, repairs)
    surveys, excluded, out_of_scope = read_capsule_surveys(root)
    return surveys, excluded, out_of_scope, read_capsule_videos(root / "data")


PROFILE_COLUMNS = tuple(name for name, _ in PROFILE_FIELDS)  # the prompt's VIEWER line

# What a survey without a column some rule needs means for the kept participants (counted
# warnings in the audit: the rows are kept, the rule could not be applied).
UNCHECKED = {
    "attention_check": "{n} kept participants were not checked for attention",
    "opinion": "{n} kept participants have no opinion index from it (opinion fields empty)",
    "profile": "{n} kept participants' prompts leave their {column} out",
}


def fills(survey_row: dict, column: str) -> bool:
    """Whether the survey has `column` (a profile field also as its wave-1 ``COLUMN_w1``)."""
    return column in survey_row or (column in PROFILE_COLUMNS and f"{column}_w1" in survey_row)


def no_profiles(raw: Path, people: int) -> DataError:
    return DataError(
        f"none of the {people} kept participants has any profile field "
        f"({', '.join(PROFILE_COLUMNS)}): every prompt would say 'no profile information' "
        "(do the surveys hold these columns?)",
        file=raw,
    )


def unchecked_warning(column: str, n: int) -> str:
    """What a survey without `column` means for its `n` kept participants."""
    if column in PROFILE_COLUMNS:
        return UNCHECKED["profile"].format(n=n, column=column)
    return UNCHECKED.get(column, UNCHECKED["opinion"]).format(n=n)


def capsule_layout(raw: Path) -> bool:
    from grail.tasks.slate.capsule import capsule_root

    return capsule_root(raw) is not None


def build_rows(raw: Path, opinion_tolerance: float) -> tuple[list[dict], dict]:
    """All kept step rows (without split) and the accounting of what was dropped and why."""
    sessions_path, sessions = read_sessions(raw)
    repairs: Counter = Counter()  # fixed in place or resolved: no row lost, each one counted
    surveys, excluded, out_of_scope, videos = read_people_and_videos(raw, repairs)
    n_steps = {s.index: max(len(s.vids) - 1, 0) for s in sessions}
    rows_dropped: Counter = Counter()
    participants_dropped: Counter = Counter()
    by_person = sessions_by_person(sessions, surveys, excluded)
    rows, kept_participants = [], set()
    unchecked: Counter = Counter()  # (survey file, missing column) -> participants affected
    profiled = 0  # kept participants with any profile field
    capsule = capsule_layout(raw)
    for all_sessions in by_person.values():
        first = min(all_sessions, key=lambda s: s.started_ms)
        rows_dropped["duplicate_session"] += sum(
            n_steps[s.index] for s in all_sessions if s is not first
        )
        reason = exclusion_reason(first.urlid, surveys, excluded)
        if reason:
            participants_dropped[reason] += 1
            rows_dropped[reason] += n_steps[first.index]
            continue
        study, survey_row = surveys[first.urlid]
        survey_file = survey_row.get("_source") or f"surveys/{study}.csv"
        needed = [*ISSUES[first.issue].opinion_columns, *([] if capsule else ["attention_check"])]
        for column in [*needed, *PROFILE_COLUMNS]:  # the rules', the prompt's VIEWER line's
            if not fills(survey_row, column):
                unchecked[(survey_file, column)] += 1
        opinion = opinion_fields(survey_row, study, first.issue, raw, opinion_tolerance)
        found = [
            row | opinion
            for row in session_rows(first, videos, sessions_path, rows_dropped, repairs)
        ]
        if not found:
            participants_dropped["no_steps"] += 1
            continue
        kept_participants.add(survey_row["participant_id"])
        person = {
            "participant_id": survey_row["participant_id"],
            "study": study,
            "viewer": viewer_profile(survey_row),
        }
        rows += [person | row for row in found]
        profiled += any(person["viewer"].get(column) for column in PROFILE_COLUMNS)
    accounting = {
        "rows_in": sum(n_steps.values()),
        "rows_kept": len(rows),
        "rows_dropped": dict(sorted((k, v) for k, v in rows_dropped.items() if v)),
        "participants_in": len(by_person),
        "participants_kept": len(kept_participants),
        "participants_dropped": dict(sorted(participants_dropped.items())),
        "repairs": dict(sorted(repairs.items())),
        **({"out_of_scope": out_of_scope} if out_of_scope else {}),
        "sessions_in": len(sessions),
        "videos_known": len(videos),
    }
    if unchecked:
        accounting["warnings"] = [
            f"{path} has no {column} column: " + unchecked_warning(column, n)
            for (path, column), n in sorted(unchecked.items())
        ]
    if rows and not profiled:
        raise no_profiles(raw, len(kept_participants))
    if not rows:
        raise DataError(
            f"no row kept of {accounting['rows_in']} (dropped: "
            f"{', '.join(f'{k} {v}' for k, v in accounting['rows_dropped'].items()) or 'none'}): "
            "nothing to train or benchmark on",
            file=raw,
        )
    if accounting["rows_in"] != len(rows) + sum(rows_dropped.values()):
        raise RuntimeError(f"row accounting does not add up: {accounting}")
    return rows, accounting


def sessions_by_person(
    sessions: list[Session], surveys: dict, excluded: dict
) -> dict[str, list[Session]]:
    """Sessions grouped per person: a person who took the study twice, under the same urlid or
    another one, is not two people; without a survey the urlid stands in."""
    by_person: dict[str, list[Session]] = {}
    for session in sessions:
        match = surveys.get(session.urlid)
        person = (
            match[1]["participant_id"]
            if match
            # an excluded survey row of a kept person (their later duplicate) is its own entry,
            # so their kept row's sessions are not judged by it
            else f"{excluded[session.urlid][1]}#{session.urlid}"
            if session.urlid in excluded
            else f"urlid:{session.urlid}"
        )
        by_person.setdefault(person, []).append(session)
    return by_person


def exclusion_reason(urlid: str, surveys: dict, excluded: dict) -> str | None:
    """Why a person's rows are dropped (no survey, an excluded survey row, a failed attention
    check), or None when they are kept."""
    match = surveys.get(urlid)
    if match is None:
        return excluded.get(urlid, ("no_survey",))[0]
    if match[1].get("attention_check", "").lower() in FAILED_ATTENTION:
        return "failed_attention_check"
    return None


def opinion_fields(survey_row: dict, study: str, issue: str, raw: Path, tolerance: float) -> dict:
    """The person's opinion index before and after the study, and its direction."""
    survey_file = Path(survey_row.get("_source") or raw / "surveys" / f"{study}.csv")
    line = f"participant {survey_row['participant_id']}"
    before_col, after_col = ISSUES[issue].opinion_columns
    before = _opinion(survey_row, before_col, survey_file, line)
    after = _opinion(survey_row, after_col, survey_file, line)
    return {
        "opinion_before": before,
        "opinion_after": after,
        "opinion_direction": opinion_direction(before, after, tolerance),
    }


def clean_steps(
    raw: str | Path,
    out: str | Path,
    validation_fraction: float = 0.1,
    seed: int = 2024,
    opinion_tolerance: float = 0.05,
) -> dict:
    """Read the raw export `raw`, write both splits and the audit under `out`; return the
    audit. The settings as :class:`grail.clean.config.CleanConfig` checks them."""
    raw, out = Path(raw), Path(out)
    rows, accounting = build_rows(raw, opinion_tolerance)
    split = split_participants([r["participant_id"] for r in rows], validation_fraction, seed)
    for row in rows:
        row["split"] = split[row["participant_id"]]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    accounting["rows_by_split"] = {name: sum(r["split"] == name for r in rows) for name in SPLITS}
    accounting["settings"] = {
        "validation_fraction": validation_fraction,
        "seed": seed,
        "opinion_tolerance": opinion_tolerance,
    }
    report = {"task": "slate", "accounting": accounting} | audit_module.audit_table(table)
    with atomic_folder(out, "clean") as staging:  # complete or absent, never mixed
        for name in SPLITS:
            pq.write_table(
                table.filter(pa.compute.equal(table["split"], name)), staging / f"{name}.parquet"
            )
        for name in TRUTH_FILES:  # from `grail simulate`: the benchmark's exact ceiling
            if (raw / name).is_file():
                shutil.copyfile(raw / name, staging / name)
        (staging / "audit.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        (staging / "audit.md").write_text(audit_module.audit_markdown(report))
    return report


def clean(raw: str | Path, out: str | Path, config) -> dict:
    """``grail clean``'s slate task: :func:`clean_steps` with the settings of `config`
    (:class:`grail.clean.config.CleanConfig`)."""
    return clean_steps(raw, out, config.validation_fraction, config.seed, config.opinion_tolerance)


def cleaned(report: dict, out: str | Path) -> str:
    """What ``grail clean`` prints: the audit, and the files it wrote."""
    return (
        audit_module.audit_markdown(report)
        + f"\nwrote {out}/train.parquet, validation.parquet, audit.json, audit.md"
    )


def audit_markdown(report: dict) -> str:
    """The audit as Markdown (``audit.md``)."""
    return audit_module.audit_markdown(report)


def audit_counts(report: dict) -> dict:
    """The row accounting the pipeline logs: rows in, rows kept, participants kept."""
    return {k: report["accounting"][k] for k in ("rows_in", "rows_kept", "participants_kept")}


def clean_params(config, participants: int, documents: int) -> dict:
    """What the pipeline's clean run records: the study's size (participants; 0: the real
    study's) and the split's share."""
    return {"synthetic": participants, "validation_fraction": config.validation_fraction}
