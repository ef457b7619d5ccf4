"""Stage outputs that are complete or absent, never mixed, and ownership that a copied or
hand-made claim cannot borrow.

:func:`atomic_folder` gives a stage a temporary sibling of its output folder to write into; when
the stage returns, a completion marker (``_COMPLETE.json``) is written last and the folder is
renamed into place, under a lock so that two writers cannot interleave. A stage killed midway
leaves the previous output as it was. The next stage checks the marker (:func:`check_complete`)
and refuses a folder without it, or whose files changed since.

The marker is also the stage's claim on the folder: it lists every file the stage wrote, in
its folders too, by relative path with its size and sha256 (a same-size edit is a change), every
folder, and the folder it was written for (its resolved path). One exception: training's
checkpoint files are recorded by size and modification time (hashing gigabytes of optimizer
state at the end of a run would take minutes; their uploads to ``checkpoint_uri`` carry sha256).
A command replaces a folder only when the claim is its own, names that very folder, and lists
everything in it by hash, unchanged (:func:`check_owned`), checked again under the lock just
before the swap; a claim without a file list, copied from another folder, or listing a file
without its hash, claims nothing. A reader of a finished output (:func:`check_complete`) checks
the files alone: an artifact may be read wherever it was downloaded.

Forging stays possible for whoever writes a marker with the folder's path and every file's
sha256 by hand: the claim guards against mistakes and copies, not against its own user.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from grail.core.errors import DataError, GrailError

MARKER = "_COMPLETE.json"
CLAIM = "_WRITER.json"  # a folder written in place (training's output_dir): which command owns it


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def replace_file(path: Path, write: Callable[[Path], object]) -> None:
    """Put a new file at `path` the way every grail write to a folder does: `write` fills a
    temporary sibling, which is then renamed over `path`. A file already there is replaced,
    never written into: a hard link to it elsewhere (a ``cp -al`` or ``rsync --link-dest``
    backup) keeps its bytes, and a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.writing")
    try:
        write(staged)
        os.replace(staged, path)
    finally:
        staged.unlink(missing_ok=True)


def replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` by :func:`replace_file`: never into the file already there."""
    replace_file(Path(path), lambda staged: staged.write_text(text))


def file_record(path: Path, hashed: bool = True) -> dict:
    """What a marker records of a file: its size and content hash, or (not `hashed`: where
    hashing would be slow) its size and modification time in nanoseconds."""
    stat = path.stat()
    if not hashed:
        return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return {"size": stat.st_size, "sha256": sha256(path)}


def recorded_size(entry) -> int:
    """The size a marker records (markers written before hashes hold the size alone)."""
    return entry if isinstance(entry, int) else entry["size"]


def is_recorded(path: Path, entry, mtime: bool = True) -> bool:
    """Whether `path` is the file a marker recorded: same size, and same sha256 when recorded
    (a same-size edit is a changed file), or the same modification time where that was
    recorded instead (not with `mtime` False: a copy elsewhere, such as a downloaded
    artifact, keeps the bytes, not the times)."""
    well_formed = (isinstance(entry, int) and not isinstance(entry, bool)) or (
        isinstance(entry, dict)
        and isinstance(entry.get("size"), int)
        and (isinstance(entry.get("sha256"), str) or isinstance(entry.get("mtime_ns"), int))
    )
    if not well_formed:  # a hand-made marker's entry: it records no file
        return False
    if not path.is_file() or path.stat().st_size != recorded_size(entry):
        return False
    if isinstance(entry, int):
        return True
    if "mtime_ns" in entry and "sha256" not in entry:
        return not mtime or path.stat().st_mtime_ns == entry["mtime_ns"]
    return sha256(path) == entry["sha256"]


# what only a resume reads, in a checkpoint's folder (optimizer, scheduler, RNG and DeepSpeed
# shard state): gigabytes, never the model's, never exported
RESUME_STATE = ("optimizer.pt", "scheduler.pt", "rng_state", "trainer_state.json", "latest",
                "zero_to_", "global_step")  # fmt: skip


def written_files(
    folder: Path, unhashed: str | None = None, hashed: bool = True, leave_out=()
) -> tuple[dict[str, dict], list[str]]:
    """Every file under `folder` (relative POSIX path -> size and sha256) and every folder,
    its own marker and claim left out, and the names `leave_out` with what is in them; a
    symbolic link is neither (so a check finds it unlisted). The resume state below a folder
    whose name starts with `unhashed` (:data:`RESUME_STATE`: training's optimizer and shards,
    gigabytes, hashed where they are uploaded), or every file when not `hashed`, get size and
    modification time; a checkpoint's model files are hashed, so that a copy of the run
    can be checked byte for byte before one is exported."""
    files, folders = {}, []
    for path in sorted(_walked(folder, leave_out)):
        name = path.relative_to(folder).as_posix()
        if path.is_symlink() or name in (MARKER, CLAIM):
            continue
        if path.is_dir():
            folders.append(name)
        elif path.is_file():
            parts = name.split("/")
            inside = [k for k, p in enumerate(parts[:-1]) if unhashed and p.startswith(unhashed)]
            slow = bool(inside) and parts[inside[0] + 1].startswith(RESUME_STATE)
            files[name] = file_record(path, hashed=hashed and not slow)
    return files, folders


def _walked(folder: Path, leave_out=()) -> list[Path]:
    """Every path under `folder` (not below a linked folder), the names `leave_out` and what
    is in them never entered: a folder another thread empties meanwhile (the checkpoint
    uploader's snapshots) is not walked into."""
    folder, found = Path(folder), []
    for top, dirs, names in os.walk(folder):
        here = Path(top)
        prefix = "" if here == folder else here.relative_to(folder).as_posix() + "/"
        dirs[:] = [d for d in dirs if prefix + d not in leave_out]
        found += [here / d for d in dirs]
        found += [here / n for n in names if prefix + n not in leave_out]
    return found


def mark_complete(
    folder: Path, stage: str, home: Path | None = None, unhashed: str | None = None, leave_out=()
) -> None:
    """Write the completion marker: the stage, every file it wrote (in its folders too) with
    its size and sha256 (size and modification time below `unhashed` folders:
    :func:`written_files`), every folder, and `home`, the folder the output lives in
    (`folder` itself unless it is a staging folder renamed there afterwards). The names
    `leave_out` are not its own (:func:`strays`): not listed."""
    files, folders = written_files(folder, unhashed, leave_out=leave_out)
    home = str(Path(home or folder).resolve())
    record = {"stage": stage, "folder": home, "files": files, "folders": folders}
    replace_text(folder / MARKER, json.dumps(record, indent=1) + "\n")


IN_PLACE = ("train",)  # the commands that write in place, under a claim (_WRITER.json)


def claim_folder(out: Path, command: str, writing: tuple[str, ...] = ()) -> None:
    """For a command that writes in place (no staging folder: training's ``output_dir``, which
    its checkpoints and a resumed run share): check `out` is its own (:func:`check_owned`),
    then record the command as its owner (``_WRITER.json``, naming this folder and listing
    what it holds, all of which the check just accepted) before anything is written; the
    top-level folders of `writing` are what it writes next (:func:`begin_write`)."""
    check_owned(out, command)
    out.mkdir(parents=True, exist_ok=True)
    earlier = _own_claim(out, command)
    files, folders = written_files(out, hashed=False)
    pending = set(writing) | set(earlier.get("writing", []) if earlier else [])
    _write_claim(out, command, files, folders, pending)


def begin_write(out: Path, command: str, names: list[str]) -> None:
    """Record in `command`'s claim on `out` the top-level folders it is about to write (a
    checkpoint, the warm start's model): found unlisted after a kill, what is in them is its
    own unfinished write, and a resume may replace it. Nothing else unlisted is."""
    claim = _held_claim(out, command)
    pending = set(claim.get("writing", [])) | set(names)
    _write_claim(out, command, claim["files"], claim["folders"], pending)


def end_write(out: Path, command: str, names: list[str]) -> None:
    """List in `command`'s claim on `out` every file and folder now in the top-level folders
    (or files) `names` it finished writing (files by size and modification time: a claim is
    rewritten at each checkpoint, and hashing gigabytes each time would take minutes)."""
    claim = _held_claim(out, command)
    files, folders = dict(claim["files"]), set(claim["folders"])
    for name in names:
        top = out / name
        if top.is_file() and not top.is_symlink():
            files[name] = file_record(top, hashed=False)
        elif top.is_dir() and not top.is_symlink():
            inside, below = written_files(top, hashed=False)
            files |= {f"{name}/{k}": v for k, v in inside.items()}
            folders |= {name} | {f"{name}/{k}" for k in below}
    pending = set(claim.get("writing", [])) - set(names)
    _write_claim(out, command, files, folders, pending)


def _held_claim(out: Path, command: str) -> dict:
    """`command`'s claim on `out`, which it holds while it writes there."""
    claim = _own_claim(out, command)
    if claim is None:
        raise GrailError(f"{out}: `grail {command}` lost its claim ({CLAIM}) while writing")
    return claim


def _write_claim(out: Path, command: str, files: dict, folders, writing) -> None:
    """The claim, written whole to a temporary file and renamed over the last one: a run
    killed while writing it leaves the previous claim."""
    record = {"command": command, "folder": str(out.resolve()), "files": files}
    record |= {"folders": sorted(folders), "writing": sorted(writing)}
    staged = out / f".{CLAIM}.{os.getpid()}"
    staged.write_text(json.dumps(record) + "\n")
    staged.replace(out / CLAIM)


def _own_claim(out: Path, command: str) -> dict | None:
    """`out`'s ``_WRITER.json`` when it is `command`'s claim on this very folder (a command
    that writes in place) listing what it wrote; anything else claims nothing."""
    claim = _read_json(out / CLAIM)
    if claim is None or command not in IN_PLACE or claim.get("command") != command:
        return None
    listed = isinstance(claim.get("files"), dict) and isinstance(claim.get("folders"), list)
    listed = listed and isinstance(claim.get("writing", []), list)
    return claim if listed and claim.get("folder") == str(out.resolve()) else None


def strays(out: Path, command: str) -> list[str]:
    """What in `out` (relative names; a folder once, not what is inside it) `command`'s claim
    neither lists (as it was) nor says it is writing: put there while it ran, by someone
    else. Its marker leaves them out (:func:`mark_complete`), so no later run takes them for
    its own."""
    claim = _own_claim(out, command)
    if claim is None:
        return []
    found = sorted(name for name, _ in _unclaimed(out, command, claim))
    return [n for n in found if not any(n.startswith(f + "/") for f in found)]  # outermost


def _check_claimed(out: Path, command: str, claim: dict) -> None:
    """A folder `command` claimed holds only what its claim (or its own finished run's marker)
    lists, unchanged, and what is inside a top-level folder the claim says it was writing
    (``writing``: :func:`begin_write`) when it stopped; a link, or anything else, is refused
    in one line naming it."""
    for name, why in _unclaimed(out, command, claim):
        if why == "link":
            raise GrailError(
                f"{out}: {name} is a symbolic link; grail never writes through a link: move "
                "it, or choose another output folder"
            )
        raise GrailError(
            f"{out}: {name} was {why} written by `grail {command}`; it is not replaced: "
            "move it, or choose another output folder"
        )


def _unclaimed(out: Path, command: str, claim: dict):
    """Each (name, why) in `out` that `command`'s claim does not account for (the checks of
    :func:`_check_claimed`): why is "link", "not" or "changed since it was"."""
    files, folders = dict(claim["files"]), {f for f in claim["folders"] if isinstance(f, str)}
    writing = {f for f in claim.get("writing", []) if isinstance(f, str)}
    done = _read_json(out / MARKER)
    finished = done is not None and done.get("stage") == command and _names(done, out)
    if finished and isinstance(done.get("files"), dict) and isinstance(done.get("folders"), list):
        files |= done["files"]
        folders |= {f for f in done["folders"] if isinstance(f, str)}
    for path in sorted(out.rglob("*")):
        name = path.relative_to(out).as_posix()
        if name in (CLAIM, MARKER):
            continue
        if path.is_symlink():
            yield name, "link"
            continue
        top = name.split("/", 1)[0]
        unfinished = top in writing  # its folder, or a file written whole (a model card)
        entry = files.get(name)
        timed = isinstance(entry, dict)  # a bare size records no file (only an old marker's)
        listed = (path.is_dir() and name in folders) or (timed and is_recorded(path, entry))
        if not (listed or unfinished):
            yield name, "changed since it was" if name in files else "not"


def check_owned(out: Path, command: str) -> None:
    """Refuse to write `out` unless it is absent, empty, or this command's own: a finished
    output of `command` written for this folder (its marker names the command and the folder)
    holding only what the marker lists, unchanged, in its folders too, or a folder `command`
    claimed (:func:`claim_folder`). Anything else, one line naming the folder and what in it is
    not the command's (exit 2): a command never deletes a file it did not write. A symbolic
    link is never written through."""
    out = Path(out)
    if out.is_symlink():
        raise GrailError(
            f"{out}: is a symbolic link; name the folder it points to, grail never writes "
            "through a link"
        )
    check_outside_exports(out)
    if not out.exists():
        return
    if not out.is_dir():
        raise GrailError(f"{out}: exists and is not a folder")
    entries = sorted(out.iterdir())
    if not entries:
        return
    claimed = _own_claim(out, command)
    if claimed is not None:
        _check_claimed(out, command, claimed)
        return
    claim = _read_json(out / CLAIM)
    if claim is not None and claim.get("command") == command and _names(claim, out):
        raise GrailError(
            f"{out}: its {CLAIM} lists no files (an older grail's, or made by hand), so it "
            "claims nothing: choose another output folder"
        )
    if claim is not None and claim.get("command") in IN_PLACE and _names(claim, out):
        raise GrailError(
            f"{out}: belongs to `grail {claim.get('command')}`, not `grail {command}`: "
            "choose another output folder"
        )
    written = _read_json(out / MARKER)
    if written is None or not isinstance(written.get("files"), dict) or not _names(written, out):
        why = f"no {MARKER}" if written is None else f"its {MARKER} was not written for it"
        raise GrailError(
            f"{out}: holds files that no grail stage wrote here ({why}); it is not replaced: "
            "choose another output folder"
        )
    stage = str(written.get("stage", "?"))
    if stage != command:
        raise GrailError(
            f"{out}: is the output of `grail {stage.split(' ')[0]}` ({stage}), not of "
            f"`grail {command}`: replacing it would delete it; choose another output folder"
        )
    files = written["files"]
    listed_folders = written.get("folders")
    folders = (
        {f for f in listed_folders if isinstance(f, str)}
        if isinstance(listed_folders, list)
        else set()
    )
    for path in sorted(out.rglob("*")):
        name = path.relative_to(out).as_posix()
        if name == MARKER:
            continue
        listed = (path.is_dir() and name in folders) or (
            name in files and owns(files[name], name, stage) and is_recorded(path, files[name])
        )
        if path.is_symlink() or not listed:
            claimed = name in files and owns(files[name], name, stage)
            why = "changed since it was" if claimed else "not"
            raise GrailError(
                f"{out}: {name} was {why} written by `grail {command}`; it is not deleted: "
                "move it, or choose another output folder"
            )


# What grail export leaves at its destination's top (grail.export.stage: MANIFEST, PENDING)
EXPORT_RECORDS = ("manifest.json", "manifest.pending.json")


def check_outside_exports(out: Path) -> None:
    """Only ``grail export`` writes inside an export: refuse `out` when it, or a folder above
    it, holds an export's manifest (or an unfinished export's record). Writing there would
    break the files the manifest lists, or leave files no manifest does."""
    out = Path(out).absolute()
    real = out.resolve()  # a link in the path: the folders it really lies in count too
    for folder in dict.fromkeys((out, *out.parents, real, *real.parents)):
        for name in EXPORT_RECORDS:
            record = folder / name
            if not record.is_file() or record.is_symlink():
                continue
            try:
                found = json.loads(record.read_text())
            except (OSError, ValueError):
                continue  # not an export's manifest
            if isinstance(found, dict) and (
                name != EXPORT_RECORDS[0] or isinstance(found.get("files"), dict)
            ):
                raise GrailError(
                    f"{out}: is inside an export ({record}); only grail export writes there: "
                    "choose an output folder outside it"
                )


def owns(entry, name: str, stage: str) -> bool:
    """Whether a marker's entry can hand its file to the command: one with a sha256 (a claim
    must know the bytes), or train's size and modification time of a checkpoint's file; a
    bare size (markers of old) or size and time elsewhere hand nothing over."""
    if isinstance(entry, dict) and isinstance(entry.get("sha256"), str):
        return True
    checkpoint = any(part.startswith("checkpoint-") for part in name.split("/")[:-1])
    return stage == "train" and checkpoint and isinstance(entry, dict)


def _names(record: dict, out: Path) -> bool:
    """Whether a marker or claim was written for the folder `out` (its resolved path)."""
    return record.get("folder") == str(out.resolve())


def _read_json(path: Path) -> dict | None:
    """A marker's record, None when there is none; an unreadable one raises naming it."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except ValueError:
        raise GrailError(f"{path}: unreadable (not grail's JSON): move it away") from None
    if not isinstance(record, dict):
        raise GrailError(f"{path}: unreadable (not grail's JSON): move it away")
    return record


def read_record(path: Path, what: str) -> dict:
    """A JSON object grail wrote (`what` names it: "a benchmark's metrics", "a prompt
    record"), read whole; one line naming the file when it is not UTF-8, not JSON, or not an
    object (a hand-edited or truncated file), instead of a traceback further on."""
    try:
        record = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        reason = "not UTF-8" if isinstance(error, UnicodeDecodeError) else "not JSON"
        raise GrailError(f"{path}: not {what} ({reason})") from None
    if not isinstance(record, dict):
        raise GrailError(f"{path}: not {what} (not a JSON object)")
    return record


def read_benchmark(folder: Path) -> dict:
    """A benchmark output's ``metrics.json``, checked against the folder's marker first (an
    edited metrics or predictions file is refused, and so is a folder without its marker: a
    benchmark interrupted, or metrics put there or edited by hand with the marker removed),
    then read as :func:`read_record`."""
    folder = Path(folder)
    if not (folder / "metrics.json").is_file():
        raise GrailError(f"{folder}: no metrics.json (not a benchmark output)")
    if not (folder / MARKER).is_file():
        raise GrailError(
            f"{folder}: no {MARKER}: not a finished benchmark (interrupted, or its metrics put "
            "or edited here by hand); run grail benchmark again"
        )
    check_complete(folder)
    return read_record(folder / "metrics.json", "a benchmark's metrics")


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
        files.items()
    except (ValueError, KeyError, TypeError, AttributeError):
        raise DataError(f"unreadable {MARKER}", file=folder) from None
    for name, entry in files.items():
        if not is_recorded(folder / name, entry, mtime=False):
            raise DataError(
                f"{name} is not the file {written.get('stage', 'the stage')} wrote "
                "(missing or changed since)",
                file=folder,
            )
    return written


def check_listed(path: Path) -> None:
    """A file read on its own (``--data clean/validation.parquet``) whose folder is a finished
    output listing it: checked against that entry, as the folder would be (a file cut to 3 of
    its rows is refused, not scored). A file no marker lists is read as it is."""
    path = Path(path)
    written = _read_json(path.parent / MARKER) if path.is_file() else None
    entry = (written or {}).get("files", {}).get(path.name)
    if entry is not None and not is_recorded(path, entry, mtime=False):
        raise DataError(
            f"{path.name} is not the file {written.get('stage', 'the stage')} wrote (missing "
            "or changed since)",
            file=path.parent,
        )


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


LEFTOVER = "_LEFTOVER.json"  # inside a staging or swapped-out folder: grail's, deletable


def mark_leftover(path: Path, pid: int | None = None) -> None:
    """Name `path` (a staging folder, or an old output swapped out) grail's own leftover: the
    folder it is (a copy elsewhere claims nothing) and, for a staging folder, its writer."""
    record = {"leftover_of": "grail", "folder": str(path.resolve()), "pid": pid}
    (path / LEFTOVER).write_text(json.dumps(record) + "\n")


def clear_leftovers(out: Path) -> list[Path]:
    """Remove what killed writers of `out` left beside it: their staging folders
    (``.NAME.writing-PID-*`` of a process no longer running) and swapped-out old outputs
    (``.NAME.old-*``), each only when it holds grail's leftover marker naming that very folder
    (a user's ``.NAME.old`` backup is not grail's); a marker the folder cannot hold is never
    guessed. Run under the folder's lock, so no live writer's staging is touched."""
    removed = []
    prefix = f".{out.name}."  # compared as text: a name is not a glob pattern
    for path in [p for p in out.parent.iterdir() if p.name.startswith(prefix)]:
        if path.is_symlink() or not path.is_dir():
            continue
        try:
            record = json.loads((path / LEFTOVER).read_text())
        except (OSError, ValueError):
            continue  # no marker, or not grail's: left alone
        if not isinstance(record, dict) or record.get("folder") != str(path.resolve()):
            continue
        kind = path.name[len(out.name) + 2 :].partition("-")[0]
        pid = record.get("pid")
        writing = kind == "writing" and isinstance(pid, int) and not isinstance(pid, bool)
        if (writing and not _alive(pid)) or (kind == "old" and pid is None):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@contextmanager
def work_folder(kind: str) -> Iterator[Path]:
    """A scratch folder, ``grail-KIND-PID-*`` in the system's temporary folder, removed at the
    end; those a killed grail process left there (their writer's pid no longer runs, and
    they hold grail's leftover marker naming them: :func:`mark_leftover`) are removed first,
    so a SIGKILL leaves no folder behind for good."""
    root = Path(tempfile.gettempdir())
    for path in root.glob(f"grail-{kind}-*"):
        try:
            record = json.loads((path / LEFTOVER).read_text())
        except (OSError, ValueError):
            continue  # not grail's marked scratch: left alone
        pid = record.get("pid") if isinstance(record, dict) else None
        mine = isinstance(record, dict) and record.get("folder") == str(path.resolve())
        if mine and isinstance(pid, int) and not isinstance(pid, bool) and not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix=f"grail-{kind}-{os.getpid()}-"))
    try:
        mark_leftover(folder, os.getpid())
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def check_own_folder(out: Path, here: bool = True) -> None:
    """An output folder of its own: not a symbolic link (never written through), and (with
    `here`) not the current folder nor one holding it, nor a path that starts with a ``~`` no
    shell expanded (``--out '~'`` made a folder named ``~`` here; libraries writing the
    path as given would do the same), nor a file or a path below one (one line, not the
    ``Not a directory`` of the first write)."""
    if str(out).startswith("~"):
        raise GrailError(
            f"{out}: starts with '~', which no shell expanded: give the folder's path itself "
            "(e.g. $HOME/...)"
        )
    out = Path(out)
    if out.is_symlink():
        raise GrailError(
            f"{out}: is a symbolic link; name the folder it points to, grail never writes "
            "through a link"
        )
    for place in (out, *out.absolute().parents):  # the nearest that exists must be a folder
        if place.is_dir():
            break
        if place.exists():
            where = "" if place == out else f" (so {out} cannot be made)"
            raise GrailError(f"{place}: exists and is not a folder{where}; name a folder")
    check_not_inside_an_output(out)
    if not here:
        return
    here = Path.cwd().resolve()
    if out.resolve() == here or out.resolve() in here.parents:
        raise GrailError(
            f"{out}: is the current folder, or holds it; name an output folder of its own"
        )


def check_not_inside_an_output(out: Path) -> None:
    """Refuse a folder below another command's output: a finished one (its marker) or one a
    training writes in place (its claim), but the folder this process itself holds
    (:func:`one_writer`: a training's own ``sft/``). Written there, it would be a file that
    output's marker does not list: the output could no longer be exported or read until it was
    moved out by hand."""
    held = os.environ.get(WRITING)
    for folder in Path(out).absolute().parents:
        if held and folder == Path(held):
            return
        for record, what in ((MARKER, "a finished output"), (CLAIM, "an output written in place")):
            if (folder / record).is_file():
                found = _read_json(folder / record) or {}
                stage = found.get("stage") or found.get("command")
                whose = f" of {stage}" if isinstance(stage, str) else ""
                raise GrailError(
                    f"{out}: is inside {folder}, {what}{whose}; nothing was written: write "
                    "beside it, not into it"
                )


def check_writable(out: str | Path, stage: str) -> None:
    """What :func:`atomic_folder` refuses, refused before the work: a stage that scores or
    trains for minutes checks its output folder first, not when it writes."""
    check_own_folder(Path(out))
    check_owned(Path(out), stage)


@contextmanager
def atomic_folder(out: str | Path, stage: str) -> Iterator[Path]:
    """Yield a temporary sibling of `out` to write into; on success, mark it complete and put
    it in place of `out` (an earlier output of the same stage there goes only then). A folder
    that is not this stage's own (:func:`check_owned`: another stage's output, a model,
    someone's files) is never replaced: an error names it first."""
    out = Path(out)
    check_writable(out, stage)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent):
        clear_leftovers(out)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.writing-{os.getpid()}-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    # mkdtemp makes it private; the output should not be. A setgid bit it inherited from its
    # parent (a shared group folder) is kept.
    staging.chmod((0o777 & ~umask) | (staging.stat().st_mode & stat.S_ISGID))
    mark_leftover(staging, os.getpid())
    try:
        yield staging
        (staging / LEFTOVER).unlink()
        mark_complete(staging, stage, home=out)
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        with _locked(out.parent):
            check_owned(out, stage)  # again: what is there now may have come since the start
            if out.exists():
                keep_mode(out, staging)
                os.rename(out, old)
                mark_leftover(old)
            os.rename(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


WRITING = "GRAIL_WRITING"  # the folder a process above this one holds (:func:`one_writer`)


@contextmanager
def one_writer(folder: str | Path, command: str) -> Iterator[None]:
    """Hold `folder` while `command` writes it in place (training's ``output_dir``): an
    ``flock`` on the folder itself, taken without waiting and held until the process ends (a
    killed writer's goes with it), so a second writer started beside it is refused at once in
    one line instead of both writing checkpoints into one folder. Processes this one starts
    (its training ranks) inherit the hold (``GRAIL_WRITING``). A folder made here that holds
    nothing but the command's own claim when it ends (refused after claiming: a fork, a late
    recipe error) is removed again."""
    folder = Path(folder).expanduser().absolute()
    if os.environ.get(WRITING) == str(folder):
        yield
        return
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    handle = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise GrailError(
                f"{folder}: another {command} is writing this folder now; one writer per "
                "folder: wait for it to end, or choose another"
            ) from None
        os.environ[WRITING] = str(folder)
        try:
            yield
        finally:
            os.environ.pop(WRITING, None)
            if made and {p.name for p in folder.iterdir()} <= {CLAIM}:
                with suppress(OSError):  # refused before writing: its own claim alone
                    (folder / CLAIM).unlink(missing_ok=True)
                    folder.rmdir()
    finally:
        os.close(handle)  # releases the flock


def keep_mode(folder: Path, staging: Path) -> None:
    """`staging`, about to replace `folder`, takes its permissions (setgid included) and its
    group where this user may set it: a folder a user made for the output keeps the access
    they gave it."""
    made = folder.stat()
    os.chmod(staging, stat.S_IMODE(made.st_mode))
    with suppress(PermissionError):
        os.chown(staging, -1, made.st_gid)


def write_own_file(path: str | Path, text: str, command: str, is_own) -> Path:
    """Write `text` to the single file `path` (``grail audit --json``), replacing only a file
    `command` wrote (`is_own(path)`), never through a link nor inside an export: anything
    else is refused in one line, the file whole. Written to a temporary sibling, then
    renamed."""
    path = Path(path)
    check_own_file(path, command, is_own)
    replace_text(path, text)
    return path


def check_own_file(path: Path, command: str, is_own) -> None:
    """A single file `command` may write: absent or its own (`is_own(path)`), not a link, not
    inside an export; anything else one line, the file whole."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise GrailError(f"{path}: is a link or not a file; grail {command} writes a plain file")
    check_outside_exports(path.parent)
    if path.exists() and not is_own(path):
        raise GrailError(
            f"{path}: exists and `grail {command}` did not write it; it is not replaced: "
            "choose another file"
        )
