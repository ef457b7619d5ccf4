"""The published study export as it is: the CodeOcean capsule's layout and inclusion rules.

``grail clean --raw CAPSULE`` (the capsule root, or its ``data/`` folder) reads:

- sessions: ``data/platform session data/sessions.json``;
- recommendation trees: ``data/recommendation trees/trees_gun/*.csv``, ``.../trees_wage/*.csv``;
- video metadata: ``data/supplemental/metadata and ratings/*.csv``, whose columns carry a prefix
  (``origin``, ``rec``, ``video`` or none) before the field (``originTitle``, ``recViewCount``,
  ``video_id``, ...);
- surveys under ``results/intermediate data/``: study 1, ``gun control (issue 1)/
  guncontrol_qualtrics_w1_clean.csv`` (wave 1) joined by ``worker_id`` with the
  ``..._w123_clean.csv`` follow-up; study 2, ``minimum wage (issue 2)/qualtrics_w12_clean.csv``;
  study 3 (YouGov), ``minimum wage (issue 2)/yg_w12_clean.csv``, keyed by ``caseid``.

Inclusion, as the paper's preprocessing: studies 1 and 2 pass both attention checks (``q87`` is
"Quick and easy", ``q89`` is "wikiHow"), a survey time of at least 120 s and a wave-1 issue index
within [0.05, 0.95] (gun) or [0.025, 0.975] (wage); every study drops the control arm and
participants without a ``pro``/``anti`` assignment, and keeps each participant's earliest survey
row. Each exclusion is counted by its rule. Study 4 (Shorts, ``.rds`` logs without slates) is out
of scope and reported as such when present.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from grail.core.errors import DataError
from grail.tasks.slate.raw import (
    VideoInfo,
    clean_text,
    normalize_video_id,
    parse_count,
    parse_duration,
    read_csv,
)

SESSIONS = Path("platform session data") / "sessions.json"
INTERMEDIATE = Path("results") / "intermediate data"
GUN_DIR = INTERMEDIATE / "gun control (issue 1)"
WAGE_DIR = INTERMEDIATE / "minimum wage (issue 2)"
ATTENTION = {"q87": "Quick and easy", "q89": "wikiHow"}
MIN_SURVEY_SECONDS = 120.0
PREFIXES = {  # column prefix -> the id columns it goes with
    "origin": ("originID", "originId", "origin_id"),
    "rec": ("recID", "recId", "rec_id"),
    "video": ("video_id", "videoId", "videoID"),
    "": ("id", "ID"),
}
FIELDS = {
    "title": ("Title", "title", "Name"),
    "channel": ("Channel", "ChannelTitle", "channel"),
    "duration": ("Duration", "duration", "DurationSeconds", "duration_seconds"),
    "views": ("ViewCount", "viewCount", "Views", "views"),
    "likes": ("LikeCount", "likeCount", "Likes", "likes"),
    "comments": ("CommentCount", "commentCount", "Comments", "comments"),
}


@dataclass(frozen=True)
class StudyFiles:
    name: str
    issue: str
    id_column: str
    survey: Path  # relative to the capsule root
    index_column: str | None  # wave-1 issue index with its inclusion range; None: no range rule
    index_range: tuple[float, float] | None
    wave1: Path | None = None  # study 1: the wave-1 file joined by worker_id
    attention: bool = True


STUDY_FILES = (
    StudyFiles(
        "study1",
        "gun_control",
        "worker_id",
        GUN_DIR / "guncontrol_qualtrics_w123_clean.csv",
        "gun_index",
        (0.05, 0.95),
        wave1=GUN_DIR / "guncontrol_qualtrics_w1_clean.csv",
    ),
    StudyFiles(
        "study2",
        "minimum_wage",
        "worker_id",
        WAGE_DIR / "qualtrics_w12_clean.csv",
        "mw_index_w1",
        (0.025, 0.975),
    ),
    StudyFiles(
        "study3",
        "minimum_wage",
        "caseid",
        WAGE_DIR / "yg_w12_clean.csv",
        None,
        None,
        attention=False,
    ),
)


def capsule_root(raw: Path) -> Path | None:
    """The capsule root when `raw` is one or its ``data/`` folder; None for our own layout."""
    for root in (raw, raw.parent):
        if (root / "data" / SESSIONS).is_file():
            return root
    return None


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def exclusion(row: dict[str, str], study: StudyFiles) -> str | None:
    """The first inclusion rule a survey row fails, or None.

    >>> s1 = STUDY_FILES[0]
    >>> ok = {"q87": "Quick and easy", "q89": "wikiHow", "survey_time": "300",
    ...       "gun_index": "0.5", "treatment_arm": "pi", "pro": "1", "anti": "0"}
    >>> exclusion(ok, s1), exclusion(ok | {"q89": "Google"}, s1)
    (None, 'failed_attention_check')
    >>> exclusion(ok | {"survey_time": "90"}, s1), exclusion(ok | {"gun_index": "0.97"}, s1)
    ('survey_too_short', 'index_out_of_range')
    >>> exclusion(ok | {"treatment_arm": "control"}, s1), exclusion(ok | {"anti": ""}, s1)
    ('control_arm', 'missing_arm')
    """
    if study.attention and any(row.get(k, "").strip() != v for k, v in ATTENTION.items()):
        return "failed_attention_check"
    if study.attention:
        seconds = _number(row.get("survey_time"))
        if seconds is None or seconds < MIN_SURVEY_SECONDS:
            return "survey_too_short"
    if study.index_column:
        index = _number(row.get(study.index_column))
        low, high = study.index_range
        if index is None or not low <= index <= high:
            return "index_out_of_range"
    arm = row.get("treatment_arm", "").strip().lower()
    if arm == "control":
        return "control_arm"
    if not arm or not row.get("pro", "").strip() or not row.get("anti", "").strip():
        return "missing_arm"
    return None


def _started(row: dict[str, str]) -> float:
    """When the survey row started: ``start_time`` (ms) or ``start_time2`` (a date-time)."""
    ms = _number(row.get("start_time"))
    if ms is not None:
        return ms
    text = row.get("start_time2", "").strip()
    try:
        return dt.datetime.fromisoformat(text).timestamp() * 1000 if text else float("inf")
    except ValueError:
        return float("inf")


def _study_rows(root: Path, study: StudyFiles) -> list[dict[str, str]]:
    """The study's survey rows, the wave-1 columns joined in for study 1."""
    path = root / study.survey
    rows = read_csv(path, (study.id_column, "urlid", "treatment_arm", "pro", "anti"))
    if study.wave1 is None:
        return rows
    wave1_path = root / study.wave1
    wave1 = {
        r["worker_id"]: r
        for r in read_csv(wave1_path, ("worker_id", "q87", "q89", "survey_time", "gun_index"))
    }
    # Wave-1 answers (attention checks, index before) come from wave 1; the follow-up's own
    # columns (urlid, arm, the index after) win where both files have one.
    return [wave1.get(r["worker_id"], {}) | r for r in rows]


def read_capsule_surveys(
    root: Path,
) -> tuple[dict[str, tuple[str, dict[str, str]]], dict[str, tuple[str, str]], dict]:
    """Included survey rows by urlid as (study, row); excluded urlids as (reason, participant);
    and what is out of scope."""
    included: dict[str, tuple[str, dict[str, str]]] = {}
    excluded: dict[str, tuple[str, str]] = {}
    for study in STUDY_FILES:
        if not (root / study.survey).is_file():
            raise DataError("survey file of the capsule not found", file=root / study.survey)
        eligible: dict[str, list[dict[str, str]]] = {}
        for line, row in enumerate(_study_rows(root, study), start=2):
            person = row[study.id_column].strip()
            if not person:
                raise DataError(
                    "empty participant id",
                    file=root / study.survey,
                    row=f"line {line}",
                    field=study.id_column,
                )
            row["participant_id"] = person
            row["_source"] = str(root / study.survey)  # named in errors about this row
            reason = exclusion(row, study)
            if reason:
                excluded[row["urlid"]] = (reason, person)
            else:
                eligible.setdefault(person, []).append(row)
        for person, rows in eligible.items():
            first, *later = sorted(rows, key=_started)
            included[first["urlid"]] = (study.name, first)
            for row in later:
                excluded[row["urlid"]] = ("duplicate_participant", person)
    out_of_scope = {}
    if (root / "data" / "shorts").exists() or (root / INTERMEDIATE / "shorts").exists():
        out_of_scope["study4"] = "Shorts sessions (.rds, no recommendation slates): not read"
    return included, excluded, out_of_scope


def _field(row: dict[str, str], prefix: str, names: tuple[str, ...]) -> str | None:
    """The first filled column for a field: prefixed (``originTitle``, ``origin_title``), then,
    except for ``rec`` columns (those describe another video), the bare name (``title``)."""
    for name in names:
        columns = [f"{prefix}{name}", f"{prefix}_{name}"] if prefix else []
        columns += [name] if prefix != "rec" else []
        for column in columns:
            if row.get(column):
                return row[column]
    return None


def read_capsule_videos(data: Path) -> dict[str, VideoInfo]:
    """Video facts by lookup key from the supplemental metadata, then the trees fill gaps."""
    videos: dict[str, VideoInfo] = {}
    folder = data / "supplemental" / "metadata and ratings"
    files = sorted(folder.glob("*.csv"))
    if not files:
        raise DataError("no metadata CSVs in the capsule", file=folder)
    for path in [*files, *sorted((data / "recommendation trees").glob("**/*.csv"))]:
        for line, row in enumerate(read_csv(path), start=2):
            for prefix, id_columns in PREFIXES.items():
                raw_id = next((row[c] for c in id_columns if row.get(c)), None)
                if raw_id:
                    fill(videos, normalize_video_id(raw_id), row, prefix, path, line)
    return videos


def fill(videos: dict, vid: str, row: dict, prefix: str, path: Path, line: int) -> None:
    """Set the fields a video still lacks from one row's `prefix` columns."""
    info = videos.setdefault(vid.lower(), VideoInfo(id=vid))
    info.title = info.title or clean_text(_field(row, prefix, FIELDS["title"]))
    info.channel = info.channel or clean_text(_field(row, prefix, FIELDS["channel"]))
    parsers = {"duration": ("duration_seconds", parse_duration)} | {
        name: (name, parse_count) for name in ("views", "likes", "comments")
    }
    for name, (attribute, parse) in parsers.items():
        text = _field(row, prefix, FIELDS[name])
        if getattr(info, attribute) is None and text:
            try:
                setattr(info, attribute, parse(text))
            except (ValueError, OverflowError):
                raise DataError(
                    f"expected a number, got {text!r}", file=path, row=f"line {line}", field=name
                ) from None
