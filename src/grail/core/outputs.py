"""Stage outputs that are complete or absent, never mixed.

:func:`atomic_folder` gives a stage a temporary sibling of its output folder to write into; when
the stage returns, a completion marker (``_COMPLETE.json``: the stage and every file's size and
sha256) is
written last and the folder is renamed into place, under a lock so that two writers cannot
interleave. A stage killed midway leaves the previous output as it was. The next stage checks the
marker (:func:`check_complete`) and refuses a folder without it, or whose files changed since.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from grail.core.errors import DataError, GrailError

MARKER = "_COMPLETE.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_record(path: Path) -> dict:
    """What a marker records of a file: its size and content hash."""
    return {"size": path.stat().st_size, "sha256": sha256(path)}


def recorded_size(entry) -> int:
    """The size a marker records (markers written before hashes hold the size alone)."""
    return entry if isinstance(entry, int) else entry["size"]


def is_recorded(path: Path, entry) -> bool:
    """Whether `path` is the file a marker recorded: same size, and same sha256 when recorded
    (a same-size edit is a changed file)."""
    if not path.is_file() or path.stat().st_size != recorded_size(entry):
        return False
    return isinstance(entry, int) or sha256(path) == entry["sha256"]


def mark_complete(folder: Path, stage: str) -> None:
    """Write the completion marker: the stage, the size and sha256 of every file it wrote at
    the top, and the names of its folders (what :func:`check_owned` lets the stage replace)."""
    entries = sorted(folder.iterdir())
    files = {
        p.name: file_record(p)
        for p in entries
        if p.is_file() and not p.is_symlink() and p.name != MARKER
    }
    folders = [p.name for p in entries if p.is_dir() and not p.is_symlink()]
    record = {"stage": stage, "files": files, "folders": folders}
    (folder / MARKER).write_text(json.dumps(record, indent=1) + "\n")


CLAIM = "_WRITER.json"  # a folder written in place (training's output_dir): which command owns it


def claim_folder(out: Path, command: str) -> None:
    """For a command that writes in place (no staging folder: training's ``output_dir``, which
    its checkpoints and a resumed run share): check `out` is its own (:func:`check_owned`),
    then record the command as its owner (``_WRITER.json``) before anything is written."""
    check_owned(out, command)
    out.mkdir(parents=True, exist_ok=True)
    claim = out / CLAIM
    if not claim.is_file():
        claim.write_text(json.dumps({"command": command}) + "\n")


def check_owned(out: Path, command: str) -> None:
    """Refuse to write `out` unless it is absent, empty, or this command's own: a finished
    output of `command` (its marker names the command) holding only what the marker lists,
    unchanged, or a folder `command` claimed (:func:`claim_folder`). Anything else, one line
    naming the folder and what in it is not the command's (exit 2): a command never deletes a
    file it did not write. A symbolic link is never written through."""
    out = Path(out)
    if out.is_symlink():
        raise GrailError(
            f"{out}: is a symbolic link; name the folder it points to, grail never writes "
            "through a link"
        )
    if not out.exists():
        return
    if not out.is_dir():
        raise GrailError(f"{out}: exists and is not a folder")
    entries = sorted(out.iterdir())
    if not entries:
        return
    claim = _read_json(out / CLAIM)
    if claim is not None:
        if claim.get("command") == command:
            return
        raise GrailError(
            f"{out}: belongs to `grail {claim.get('command')}`, not `grail {command}`: "
            "choose another output folder"
        )
    written = _read_json(out / MARKER)
    if written is None:
        raise GrailError(
            f"{out}: holds files that no grail stage wrote (no {MARKER}); it is not replaced: "
            "choose another output folder"
        )
    stage = str(written.get("stage", "?"))
    if stage != command:
        raise GrailError(
            f"{out}: is the output of `grail {stage.split(' ')[0]}` ({stage}), not of "
            f"`grail {command}`: replacing it would delete it; choose another output folder"
        )
    files, folders = written.get("files") or {}, set(written.get("folders") or [])
    for path in entries:
        if path.name == MARKER:
            continue
        listed = (path.is_dir() and path.name in folders) or (
            path.name in files and is_recorded(path, files[path.name])
        )
        if path.is_symlink() or not listed:
            why = "changed since" if path.name in files else "not"
            raise GrailError(
                f"{out}: {path.name} was {why} written by `grail {command}`; it is not deleted: "
                "move it, or choose another output folder"
            )


def _read_json(path: Path) -> dict | None:
    """A marker's record, None when there is none; an unreadable one raises naming it."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise GrailError(f"{path}: unreadable (not grail's JSON): move it away") from None
    if not isinstance(record, dict):
        raise GrailError(f"{path}: unreadable (not grail's JSON): move it away")
    return record


def check_complete(folder: Path) -> dict:
    """The marker of a finished output folder; a DataError naming what is wrong otherwise."""
    marker = folder / MARKER
    if not marker.is_file():
        raise DataError(
            f"no {MARKER}: not a finished grail output (interrupted, or files put here by hand; "
            "name a .parquet file to read one directly)",
            file=folder,
        )
    try:
        written = json.loads(marker.read_text())
        files = written["files"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise DataError(f"unreadable {MARKER}", file=folder) from None
    for name, entry in files.items():
        if not is_recorded(folder / name, entry):
            raise DataError(
                f"{name} is not the file {written.get('stage', 'the stage')} wrote "
                "(missing or changed since)",
                file=folder,
            )
    return written


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive flock on `folder` itself (no lock file to leave behind)."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # releases the lock


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clear_leftovers(out: Path) -> list[Path]:
    """Remove what killed writers of `out` left beside it: their staging folders
    (``.NAME.writing-PID-*`` of a process no longer running), swapped-out old outputs
    (``.NAME.old-*``) and the lock files earlier versions used (``.NAME.lock``). Run under
    the folder's lock, so no live writer's staging is touched."""
    removed = []
    for path in out.parent.glob(f".{out.name}.*"):
        kind, _, rest = path.name[len(out.name) + 2 :].partition("-")
        pid = rest.split("-", 1)[0]
        dead_writer = kind == "writing" and pid.isdigit() and not _alive(int(pid))
        if dead_writer or kind == "old" or path.name == f".{out.name}.lock":
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


@contextmanager
def atomic_folder(out: str | Path, stage: str) -> Iterator[Path]:
    """Yield a temporary sibling of `out` to write into; on success, mark it complete and put
    it in place of `out` (an earlier output of the same stage there goes only then). A folder
    that is not this stage's own (:func:`check_owned`: another stage's output, a model,
    someone's files) is never replaced: an error names it first."""
    out = Path(out)
    check_owned(out, stage)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent):
        clear_leftovers(out)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.writing-{os.getpid()}-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; the output should not be
    try:
        yield staging
        mark_complete(staging, stage)
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        with _locked(out.parent):
            if out.exists():
                os.rename(out, old)
            os.rename(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
