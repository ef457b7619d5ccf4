"""Builders for small hand-made raw exports (rule-by-rule tests)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

VIDEO_COLUMNS = ["id", "title", "channel", "duration", "views", "likes", "comments"]


def write_raw(
    root: Path,
    sessions: list[dict],
    survey: list[dict],
    videos: list[dict],
    study: str = "study1",
) -> Path:
    """A minimal hand-made raw export (for rule-by-rule tests)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "sessions.json").write_text(json.dumps(sessions))
    (root / "surveys").mkdir(exist_ok=True)
    columns = sorted({k for row in survey for k in row})
    with (root / "surveys" / f"{study}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(survey)
    with (root / "video_metadata.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=VIDEO_COLUMNS)
        writer.writeheader()
        writer.writerows(videos)
    return root


def video(vid: str, **fields) -> dict:
    return {
        "id": vid,
        "title": f"Title {vid}",
        "channel": f"Channel {vid}",
        "duration": "60",
        "views": "100",
        "likes": "10",
        "comments": "1",
    } | fields


def session(sid: str, urlid: str, vids: list[str], slates, start: int = 0, **fields) -> dict:
    return {
        "sessionID": sid,
        "urlid": urlid,
        "issue": "gun",
        "vids": vids,
        "displayOrders": slates,
        "vidStartTimes": [start + 1000 * i for i in range(len(vids))],
        "vidWatchTimes": [30.0] * len(vids),
        "vidTotalLengths": [60] * len(vids),
    } | fields


def person(worker: str, urlid: str, **fields) -> dict:
    return {
        "worker_id": worker,
        "urlid": urlid,
        "pid1": "Democrat",
        "gun_index": "0.3",
        "gun_index_2": "0.4",
        "attention_check": "pass",
    } | fields
