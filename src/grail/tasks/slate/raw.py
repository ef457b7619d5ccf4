"""Readers for the study's raw export (the real CodeOcean capsule or ``grail simulate`` output).

Every reader checks what it reads and raises :class:`~grail.core.errors.DataError` naming the file,
the row (CSV line or session) and the field. Layout under the raw folder:

- ``sessions.json`` (anywhere below the folder): a JSON list of sessions, each with ``sessionID``,
  ``urlid``, ``issue``, ``vids`` and ``displayOrders``; optional ``vidWatchTimes``,
  ``vidTotalLengths``, ``vidStartTimes``, ``vidEndTimes``, ``percentVisible``, ``sessionFinished``,
  ``topicID``. ``displayOrders`` is either a list (item i: the slate shown while watching
  ``vids[i]``) or an object whose keys start with the 1-based step (``"1-recs"``, ``"2"``, ...).
- ``surveys/<study>.csv``: one row per participant, ids in ``worker_id`` or ``caseid``, joined on
  ``urlid``; the file's stem names the study.
- ``trees/**/*.csv``: recommendation trees (``originId``, title, channel, duration, ``rec1..recN``).
- ``video_metadata.csv``: ``id``, ``title``, ``channel``, ``duration``, ``views``, ``likes``,
  ``comments``; any field may be empty.
"""

from __future__ import annotations

import csv
import html
import json
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from grail.core.errors import DataError
from grail.tasks.slate.policy_issues import ALIASES

PARTICIPANT_ID_COLUMNS = ("worker_id", "caseid")
_URL_ID = re.compile(r"(?:youtube\.com/watch\?v=|youtu\.be/|youtube\.com/shorts/)([\w-]{6,})")
_ISO_DURATION = re.compile(r"^P(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


def normalize_video_id(raw: str) -> str:
    """The canonical form of a video id as written in logs, trees or metadata.

    >>> normalize_video_id(" https://www.youtube.com/watch?v=AbC_123-xyz&t=4 ")
    'AbC_123-xyz'
    >>> normalize_video_id("yt:AbC_123-xyz")
    'AbC_123-xyz'
    """
    text = raw.strip()
    match = _URL_ID.search(text)
    if match:
        return match.group(1)
    return re.sub(r"^(?:yt|youtube):", "", text, flags=re.IGNORECASE)


def video_key(raw: str) -> str:
    """Lookup key: ids differ in case between the study's logs and metadata, so match without it."""
    return normalize_video_id(raw).lower()


def clean_text(raw: str | None) -> str | None:
    """Unescape HTML entities, normalize Unicode and whitespace; empty becomes None.

    >>> clean_text("  Guns &amp; Laws\\n “Explained” ")
    'Guns & Laws “Explained”'
    """
    if raw is None:
        return None
    text = " ".join(unicodedata.normalize("NFC", html.unescape(raw)).split())
    return text or None


def parse_duration(raw: str) -> int | None:
    """Seconds from ``754``, ``"754.0"``, ``"12:34"``, ``"1:02:03"`` or ``"PT12M34S"``.

    >>> [parse_duration(x) for x in ("754", "12:34", "1:02:03", "PT12M34S", "")]
    [754, 754, 3723, 754, None]
    """
    text = raw.strip()
    if not text:
        return None
    iso = _ISO_DURATION.match(text)
    if iso:
        hours, minutes, seconds = (float(g) if g else 0.0 for g in iso.groups())
        return round(hours * 3600 + minutes * 60 + seconds)
    if ":" in text:
        parts = [float(p) for p in text.split(":")]
        return round(sum(p * 60**k for k, p in enumerate(reversed(parts))))
    return round(float(text))


MAX_COUNT = 2**63 - 1  # the dataset's int64


def parse_count(raw: str) -> int | None:
    """Counts such as ``"1200"``, ``"1,200"`` or ``"1.2e3"``; empty becomes None. Negative,
    non-finite or beyond-int64 counts are errors (ValueError, reported with file, row, field).

    >>> parse_count("1,200"), parse_count("1.2e3"), parse_count("")
    (1200, 1200, None)
    >>> parse_count("-5")
    Traceback (most recent call last):
    ValueError: a count cannot be negative
    """
    text = raw.strip().replace(",", "")
    if not text:
        return None
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")) or value > MAX_COUNT:
        raise ValueError("not a finite count within int64")
    if value < 0:
        raise ValueError("a count cannot be negative")
    return round(value)


@dataclass
class VideoInfo:
    id: str
    title: str | None = None
    channel: str | None = None
    duration_seconds: int | None = None
    views: int | None = None
    likes: int | None = None
    comments: int | None = None


def find_one(raw: Path, name: str) -> Path:
    """The single file called `name` below `raw`."""
    if not raw.is_dir():
        raise DataError("raw export folder not found", file=raw)
    matches = sorted(raw.rglob(name))
    folders = [m for m in matches if not m.is_file()]
    if folders:
        raise DataError(f"expected a file called {name}, found a folder", file=folders[0])
    if not matches:
        raise DataError(f"no {name} found below this folder", file=raw)
    if len(matches) > 1:
        raise DataError(f"several {name} files: {', '.join(map(str, matches))}", file=raw)
    return matches[0]


def read_csv(path: Path, required: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """Rows as dicts of stripped strings (None for absent cells); checks the required columns."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            columns = reader.fieldnames or []
            missing = [c for c in required if c not in columns]
            if missing:
                raise DataError("missing required column", file=path, field=missing[0])
            twice = sorted({c for c in columns if columns.count(c) > 1})
            if twice:  # DictReader keeps one of them: the other's cells would be lost
                raise DataError("a column named twice in the header", file=path, field=twice[0])
            rows = []
            for line, row in enumerate(reader, start=2):
                if any((v or "").strip() for v in row.get(None, [])):
                    raise DataError(
                        f"more cells than the header's {len(columns)} columns",
                        file=path,
                        row=f"line {line}",
                    )  # they would be dropped: no cell is lost silently
                rows.append({k: (v or "").strip() for k, v in row.items() if k is not None})
            return rows
    except UnicodeDecodeError as err:
        raise DataError(f"not UTF-8 text ({err.reason} at byte {err.start})", file=path) from None
    except csv.Error as err:
        raise DataError(f"malformed CSV ({err})", file=path) from None


def _typed(path: Path, line: int, column: str, parse, raw: str):
    try:
        return parse(raw)
    except (ValueError, OverflowError) as err:
        detail = f" ({err})" if "count" in str(err) else ""
        raise DataError(
            f"expected a number, got {raw!r}{detail}", file=path, row=f"line {line}", field=column
        ) from None


def read_videos(raw: Path, repairs: Counter | None = None) -> dict[str, VideoInfo]:
    """Video facts by lookup key: metadata first, recommendation trees fill what it lacks. A
    video listed twice with different facts keeps its first row (counted in `repairs`)."""
    videos: dict[str, VideoInfo] = {}
    repairs = Counter() if repairs is None else repairs
    metadata = find_one(raw, "video_metadata.csv")
    for line, row in enumerate(read_csv(metadata, ("id", "title")), start=2):
        if not row["id"]:
            raise DataError("empty video id", file=metadata, row=f"line {line}", field="id")
        vid = normalize_video_id(row["id"])
        info = VideoInfo(
            id=vid,
            title=clean_text(row["title"]),
            channel=clean_text(row.get("channel")),
            duration_seconds=_typed(
                metadata, line, "duration", parse_duration, row.get("duration", "")
            ),
            **{
                c: _typed(metadata, line, c, parse_count, row.get(c, ""))
                for c in ("views", "likes", "comments")
            },
        )
        seen = videos.setdefault(vid.lower(), info)
        if seen is not info and seen != info:
            repairs["conflicting_metadata_rows"] += 1
    for tree in sorted(raw.glob("trees/**/*.csv")):
        for line, row in enumerate(read_csv(tree, ("originId",)), start=2):
            vid = normalize_video_id(row["originId"])
            info = videos.setdefault(vid.lower(), VideoInfo(id=vid))
            info.title = info.title or clean_text(row.get("title"))
            info.channel = info.channel or clean_text(row.get("channel"))
            if info.duration_seconds is None:
                info.duration_seconds = _typed(
                    tree, line, "duration", parse_duration, row.get("duration", "")
                )
    return videos


def read_surveys(
    raw: Path, repairs: Counter | None = None
) -> dict[str, tuple[str, dict[str, str]]]:
    """Survey rows by urlid, as (study, row); the study is the CSV's file stem. A urlid given
    twice with different answers keeps its first row (counted in `repairs`)."""
    repairs = Counter() if repairs is None else repairs
    files = sorted((raw / "surveys").glob("*.csv")) if (raw / "surveys").is_dir() else []
    if not files:
        raise DataError("no survey CSVs (expected surveys/<study>.csv)", file=raw)
    by_urlid: dict[str, tuple[str, dict[str, str]]] = {}
    for path in files:
        rows = read_csv(path, ("urlid",))
        id_column = next((c for c in PARTICIPANT_ID_COLUMNS if rows and c in rows[0]), None)
        if rows and id_column is None:
            raise DataError(
                f"missing participant id column (one of {PARTICIPANT_ID_COLUMNS})",
                file=path,
                field="worker_id",
            )
        for line, row in enumerate(rows, start=2):
            if not row[id_column]:
                raise DataError(
                    "empty participant id", file=path, row=f"line {line}", field=id_column
                )
            row["participant_id"] = row[id_column]
            seen = by_urlid.setdefault(row["urlid"], (path.stem, row))
            if seen[1] is not row and seen != (path.stem, row):
                repairs["conflicting_survey_rows"] += 1
    return by_urlid


@dataclass(eq=False)  # identity: two identical duplicate sessions are still two
class Session:
    """One raw session, checked: ids normalized to lookup keys, slates aligned with steps."""

    index: int
    session_id: str
    urlid: str
    issue: str
    vids: list[str]
    slates: list[list[str] | None]  # slates[i]: shown while watching vids[i]
    watch_seconds: list[float | None]
    total_seconds: list[float | None]
    started_ms: float


def _slates(value, n_steps: int, where: str, path: Path) -> list[list[str] | None]:
    if isinstance(value, list):
        slates = list(value)
    elif isinstance(value, dict):
        slates = [None] * n_steps
        numbered = {}
        for key, slate in value.items():
            match = re.match(r"^\s*(\d+)", str(key))
            if not match:
                raise DataError(
                    f"key {key!r} does not start with a step number",
                    file=path,
                    row=where,
                    field="displayOrders",
                )
            numbered[int(match.group(1))] = slate
        # Keys count steps from 1 ("1-recs", "2", ...) in the published export; a key 0 means
        # the file counts from 0: the base is read from the keys, not assumed.
        base = 0 if 0 in numbered else 1
        for number, slate in numbered.items():
            if 0 <= number - base < n_steps:
                slates[number - base] = slate
    else:
        raise DataError(
            f"expected a list or object, got {type(value).__name__}",
            file=path,
            row=where,
            field="displayOrders",
        )
    slates = (slates + [None] * n_steps)[:n_steps]
    for k, slate in enumerate(slates):
        if slate is not None and not (
            isinstance(slate, list) and all(isinstance(v, str) for v in slate)
        ):
            raise DataError(
                "expected a list of video ids", file=path, row=where, field=f"displayOrders[{k}]"
            )
    return slates


def _numbers(session: dict, name: str, n: int, where: str, path: Path) -> list[float | None]:
    values = session.get(name)
    if values is None:
        return [None] * n
    if isinstance(values, dict):  # keyed by video id in some exports
        values = [values.get(v) for v in session["vids"]]
    if not isinstance(values, list) or not all(
        v is None or isinstance(v, int | float) for v in values
    ):
        raise DataError("expected a list of numbers", file=path, row=where, field=name)
    return [None if v is None else float(v) for v in (values + [None] * n)[:n]]


def read_sessions(raw: Path) -> tuple[Path, list[Session]]:
    """All sessions of the export, validated."""
    path = find_one(raw, "sessions.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise DataError("JSON nested too deeply to be a sessions file", file=path) from None
    except json.JSONDecodeError as err:
        raise DataError(
            f"malformed JSON at line {err.lineno} column {err.colno}: {err.msg}", file=path
        ) from None
    except UnicodeDecodeError as err:
        raise DataError(f"not UTF-8 text ({err.reason} at byte {err.start})", file=path) from None
    if isinstance(data, dict):  # {sessionID: session}
        data = [{"sessionID": k, **v} if isinstance(v, dict) else v for k, v in data.items()]
    if not isinstance(data, list):
        raise DataError(f"expected a list of sessions, got {type(data).__name__}", file=path)
    if not data:
        raise DataError("no sessions: an empty study has nothing to clean", file=path)
    sessions = []
    for index, item in enumerate(data):
        where = f"session {index}"
        if not isinstance(item, dict):
            raise DataError(f"expected an object, got {type(item).__name__}", file=path, row=where)
        for name in ("sessionID", "urlid", "issue", "vids"):
            if item.get(name) in (None, ""):
                raise DataError("missing required field", file=path, row=where, field=name)
        where = f"session {index} ({item['sessionID']})"
        vids = item["vids"]
        if not isinstance(vids, list) or not all(isinstance(v, str) for v in vids):
            raise DataError("expected a list of video ids", file=path, row=where, field="vids")
        issue = ALIASES.get(str(item["issue"]).strip().lower().replace(" ", "_"))
        if issue is None:
            raise DataError(
                f"unknown issue {item['issue']!r} (expected one of "
                f"{sorted(set(ALIASES.values()))})",
                file=path,
                row=where,
                field="issue",
            )
        starts = _numbers(item, "vidStartTimes", len(vids), where, path)
        sessions.append(
            Session(
                index=index,
                session_id=str(item["sessionID"]),
                urlid=str(item["urlid"]),
                issue=issue,
                vids=vids,
                slates=_slates(item.get("displayOrders", []), max(len(vids) - 1, 0), where, path),
                watch_seconds=_numbers(item, "vidWatchTimes", len(vids), where, path),
                total_seconds=_numbers(item, "vidTotalLengths", len(vids), where, path),
                started_ms=next((s for s in starts if s is not None), float("inf")),
            )
        )
    return path, sessions
