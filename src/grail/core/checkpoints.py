"""Checkpoints in object storage: each ``checkpoint_uri/checkpoint-N/`` uploaded whole, its
``_COMPLETE.json`` marker last (training's uploader:
:class:`grail.train.checkpoint_upload.CheckpointUploadCallback`, which snapshots every save with
hard links and uploads it in a background thread). :func:`resolve_latest` picks the newest
checkpoint whose marker exists and whose files are all there, so a half-uploaded checkpoint is
never chosen; the final model goes to ``checkpoint_uri/final`` the same way.

Across nodes each node saves its own ZeRO-3 shards on its own disk: each node uploads what it
holds with a marker of its own (``_COMPLETE.node-K-of-N.json``), and the checkpoint is complete
when all N markers and their files are there. Resuming downloads the whole checkpoint once per
node (the node's first process; the others wait and find it there): into a private folder,
renamed into place, so no process ever reads a half-written or deleted checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path

from grail.core.errors import DataError, GrailError
from grail.core.outputs import MARKER, file_record, is_recorded, recorded_size
from grail.core.storage import (
    Location,
    download_folder,
    list_files,
    read_text,
    upload_folder,
    write_text,
)

logger = logging.getLogger(__name__)
CHECKPOINT = re.compile(r"^checkpoint-([0-9]+)$")  # ASCII digits: \d takes "١"


FINAL = "final"  # the final model below checkpoint_uri, when training uploads it


NODE_MARKER = re.compile(r"^_COMPLETE\.node-(\d+)-of-(\d+)\.json$")
UPLOAD_STAGING = ".upload-staging"  # snapshots of what is being uploaded, in output_dir


def marker_name(node: int = 0, nodes: int = 1) -> str:
    """The completion marker a node writes (the plain one on a single node).

    >>> marker_name(), marker_name(1, 2)
    ('_COMPLETE.json', '_COMPLETE.node-1-of-2.json')
    """
    return MARKER if nodes == 1 else f"_COMPLETE.node-{node}-of-{nodes}.json"


def is_marker(name: str) -> bool:
    return name == MARKER or NODE_MARKER.match(name) is not None


RUN_RECORD = "_RUN.json"  # checkpoint_uri's owner: the run whose checkpoints are there
RUN = "GRAIL_CHECKPOINT_RUN"  # that run's id, for the uploads of the processes it starts


class CheckpointsOfAnotherRun(GrailError):
    """A fresh run on a checkpoint_uri that holds another run's checkpoints."""


def claim_checkpoints(uri: str, resuming: bool, parent: str | None = None) -> str:
    """Make `uri` this run's, under its lease (:mod:`grail.core.lease`): a fresh run (not
    `resuming`) on a URI that another run recorded, or that holds checkpoints, is refused in
    one line; a resumed run continues the recorded one (``latest`` reads only its
    checkpoints); a first run records a new id. A resume with no record (deleted, as the
    message for an unreadable one advises) adopts the run its checkpoints' markers name, when
    they name one; a resume whose record names a run none of the checkpoints there belongs to
    (a record copied from elsewhere) is refused: it would start fresh over them. A fork's new
    record names its `parent` (``URI@checkpoint-N``, :func:`fork_point`). Returns the
    run id (also set as ``GRAIL_CHECKPOINT_RUN`` for the processes training starts: their
    markers carry it)."""
    from grail.core.lease import lease_file
    from grail.core.outputs import check_outside_exports

    location = Location.parse(uri)
    if location.scheme == "file":  # a folder: never through a link, never inside an export
        if location.local_path.is_symlink():
            raise GrailError(f"checkpoint_uri {uri}: is a symbolic link; name its folder")
        check_outside_exports(location.local_path)
    recorded = record = run_record(location)
    if resuming:
        record = resumed_record(uri, record)
    if record is not None and not resuming:
        raise CheckpointsOfAnotherRun(
            f"checkpoint_uri {uri}: belongs to run {record.get('run')} (started "
            f"{record.get('started')}); a fresh run never writes over its checkpoints: resume "
            "it (resume_from_checkpoint: latest) or give this run a new checkpoint_uri"
        )
    if record is None:
        found = sorted(complete_checkpoints(uri))
        if found and not resuming:
            raise CheckpointsOfAnotherRun(
                f"checkpoint_uri {uri}: holds checkpoints of an earlier run (steps "
                f"{', '.join(map(str, found))}); a fresh run never writes over them: resume it "
                "(resume_from_checkpoint: latest) or give this run a new checkpoint_uri"
            )
        present = sorted(n for n in list_files(location) if n and not lease_file(n))
        if present and not resuming:
            raise CheckpointsOfAnotherRun(
                f"checkpoint_uri {uri}: holds files no run recorded ({present[0]}, "
                f"{len(present)} in all); a fresh run writes only to an empty checkpoint_uri: "
                "give this run a new one"
            )
        record = {
            "run": uuid.uuid4().hex[:12],
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if parent:  # a fork: the checkpoint it started from (fork_from)
            record["parent"] = parent
    if record is not recorded:  # a new or adopted record: written once, not read again
        write_text(location.child(RUN_RECORD), json.dumps(record))
    os.environ[RUN] = str(record.get("run"))
    return str(record.get("run"))


def checkpoint_runs(uri: str) -> dict[int, str | None]:
    """Global step -> the run its markers name (None for markers that name none) of every
    complete checkpoint under `uri`."""
    location = Location.parse(uri)
    runs = {}
    for step, name in complete_checkpoints(uri).items():
        files = list_files(location.child(name))
        named = set()
        for marker in markers(files) or []:
            try:
                named.add(json.loads(read_text(location.child(name).child(marker))).get("run"))
            except (ValueError, AttributeError):
                named.add(None)
        runs[step] = named.pop() if len(named) == 1 else None
    return runs


def resumed_record(uri: str, record: dict | None) -> dict | None:
    """The run record a resume continues: the recorded one when some checkpoint there is its
    own (or there are none, or none names a run); without a record, the one run the
    checkpoints' markers name (adopted). Refused in one line: checkpoints of several runs and
    no record, or a record none of the checkpoints belongs to."""
    runs = checkpoint_runs(uri)
    named = {run for run in runs.values() if run}
    steps = ", ".join(f"{step} ({run or 'no run named'})" for step, run in sorted(runs.items()))
    if record is None:
        if len(named) > 1:
            raise CheckpointsOfAnotherRun(
                f"checkpoint_uri {uri}: no run record, and its checkpoints come from "
                f"{len(named)} runs (steps {steps}): which to resume is not known; give this "
                "run a new checkpoint_uri"
            )
        if not named:
            return None
        run = named.pop()
        logger.info("%s: no run record; resuming run %s, which its checkpoints name", uri, run)
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return {"run": run, "started": started, "adopted": True}
    own = str(record.get("run"))
    if named and own not in named and not any(run is None for run in runs.values()):
        raise CheckpointsOfAnotherRun(
            f"checkpoint_uri {uri}: its run record names run {own}, but no checkpoint there is "
            f"that run's (steps {steps}): resuming would start fresh over them. If they are "
            f"this training's, delete {RUN_RECORD} there (a resume adopts the run its "
            "checkpoints name); else give this run a new checkpoint_uri"
        )
    return record


def run_record(location: Location) -> dict | None:
    """``checkpoint_uri/_RUN.json``: the run that owns the checkpoints there, or None."""
    if RUN_RECORD not in list_files(location):
        return None
    try:
        record = json.loads(read_text(location.child(RUN_RECORD)))
    except ValueError:
        record = None
    if not isinstance(record, dict) or "run" not in record:
        raise GrailError(
            f"{location.child(RUN_RECORD)}: not a run record (unreadable): delete it to let a "
            "run resume the checkpoints there, or use another checkpoint_uri"
        )
    return record


def upload_complete(
    folder: Path, target: Location, step: int, node: int = 0, nodes: int = 1
) -> list[str]:
    """Upload `folder`'s files to `target`, then the marker listing them with their sizes and
    sha256 and the run that wrote them (the last object: a reader that finds it finds every
    file, and can tell a file another writer replaced since)."""
    names = [n for n in upload_folder(folder, target) if not is_marker(n)]
    records = {name: file_record(folder / name) for name in names}
    marker = {"global_step": step, "files": records, "node": node, "nodes": nodes}
    if os.environ.get(RUN):
        marker["run"] = os.environ[RUN]
    write_text(target.child(marker_name(node, nodes)), json.dumps(marker))
    return names


def markers(files: dict[str, int]) -> list[str] | None:
    """The markers that make a checkpoint complete, when they are all among `files`."""
    if MARKER in files:
        return [MARKER]
    found = [NODE_MARKER.match(name) for name in files]
    counts = {int(m.group(2)) for m in found if m}
    if len(counts) != 1:
        return None
    (nodes,) = counts
    names = [marker_name(node, nodes) for node in range(nodes)]
    return names if all(name in files for name in names) else None


def listed_files(
    location: Location, files: dict[str, int] | None = None, run: str | None = None
) -> dict | None:
    """Name -> record (size and sha256) of every file the checkpoint's markers list; None when
    it is incomplete (a marker missing, or a listed file missing or of another size), or, with
    `run`, written by another run. Contents are checked where the files are read
    (:func:`download_into_place`)."""
    files = list_files(location) if files is None else files
    names = markers(files)
    if names is None:
        return None
    listed = {}
    for name in names:
        try:
            marker = json.loads(read_text(location.child(name)))
            listed |= marker["files"]
        except (ValueError, KeyError, TypeError):
            return None
        if run is not None and marker.get("run", run) != run:
            return None
    return listed if all(files.get(n) == recorded_size(e) for n, e in listed.items()) else None


def is_complete(
    location: Location, files: dict[str, int] | None = None, run: str | None = None
) -> bool:
    """Whether every marker below `location` exists and every file they list has its size
    (and, with `run`, that run wrote it)."""
    return listed_files(location, files, run) is not None


def upload_final(output_dir: str | Path, uri: str, step: int) -> None:
    """The final model (the top-level files of `output_dir`, not its checkpoints) to
    ``uri/final``."""
    staging = Path(output_dir) / UPLOAD_STAGING / FINAL
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for path in Path(output_dir).iterdir():
        if path.is_file() and path.name != MARKER:
            os.link(path, staging / path.name)
    target = Location.parse(uri).child(FINAL)
    upload_complete(staging, target, step)
    shutil.rmtree(staging, ignore_errors=True)
    logger.info("uploaded the final model to %s", target)


def download_final(uri: str, out: str | Path) -> bool:
    """Download ``uri/final`` into `out` when it is complete; False when it is not there."""
    location = Location.parse(uri).child(FINAL)
    listed = listed_files(location)
    if listed is None:
        return False
    download_folder(location, Path(out))
    check_recorded(location, Path(out), listed)
    return True


def complete_checkpoints(uri: str, run: str | None = None, warn: bool = False) -> dict[int, str]:
    """Global step -> name of every fully uploaded checkpoint under `uri` (with `run`, of that
    run alone); with `warn`, each checkpoint left out is named in one line."""
    location = Location.parse(uri)
    files = list_files(location)
    found = {}
    for name in sorted({key.split("/", 1)[0] for key in files}):
        match = CHECKPOINT.match(name)
        inner = {k.split("/", 1)[1]: v for k, v in files.items() if k.startswith(f"{name}/")}
        if not match:
            continue
        if is_complete(location.child(name), inner, run):
            found[int(match.group(1))] = name
        elif warn:
            why = (
                "written by another run"
                if is_complete(location.child(name), inner)
                else "incomplete or truncated (a marker or a listed file missing, or of another "
                "size)"
            )
            logger.warning("%s/%s: skipped, %s", uri, name, why)
    return found


def resolve_latest(uri: str) -> str | None:
    """Name of the newest complete checkpoint under `uri` of the run that owns it
    (:func:`claim_checkpoints`), or None when there is none."""
    record = run_record(Location.parse(uri))
    found = complete_checkpoints(uri, record and str(record["run"]), warn=True)
    return found[max(found)] if found else None


def local_copy_matches(folder: Path, listed: dict) -> bool:
    """Whether `folder` holds every listed file as recorded (a copy this node made already)."""
    return all(is_recorded(folder / name, entry) for name, entry in listed.items())


def check_recorded(location: Location, folder: Path, listed: dict) -> None:
    """A DataError naming the first downloaded file that is not the one its marker recorded
    (another writer replaced it after the marker was written)."""
    for name, entry in sorted(listed.items()):
        if not is_recorded(folder / name, entry):
            raise DataError(
                f"{name} is not the file its marker records (size or sha256 differ): corrupted "
                "or replaced after the checkpoint was completed; it is not used",
                file=location,
            )


def download_into_place(
    location: Location, target: Path, checkpoint: bool = True, listed: dict | None = None
) -> None:
    """Download `location` into `target` as a whole: into a private folder beside it, then
    renamed into place (an older folder of that name moved aside first), so no reader of
    `target` sees it half-written or deleted. A checkpoint's upload markers are left out.
    With `listed` (the markers' records) every file is checked against its sha256 first."""
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    download_folder(location, partial)
    if listed is not None:
        try:
            check_recorded(location, partial, listed)
        except DataError:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    for name in [p for p in os.listdir(partial) if checkpoint and is_marker(p)]:
        (partial / name).unlink()
    if target.exists():
        stale = target.with_name(f".{target.name}.stale-{os.getpid()}")
        target.rename(stale)
        shutil.rmtree(stale, ignore_errors=True)
    partial.rename(target)
    logger.info("downloaded %s into %s", location, target)


def download_latest(uri: str, output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of the run that owns `uri`, downloaded into `output_dir`
    unless a complete copy is there already; a checkpoint whose files are not the ones its
    marker records (corrupted since) is named in one line and the one before it is taken;
    None when there is none."""
    record = run_record(Location.parse(uri))
    found = complete_checkpoints(uri, record and str(record["run"]), warn=True)
    for step in sorted(found, reverse=True):
        name = found[step]
        location = Location.parse(uri).child(name)
        target = Path(output_dir) / name
        listed = listed_files(location)
        if listed is not None and local_copy_matches(target, listed):
            return target
        try:
            download_into_place(location, target, listed=listed)
        except DataError as err:
            logger.warning("%s: skipped, %s", location, err)
            continue
        return target
    return None


def fork_point(fork_from: str) -> tuple[str, int]:
    """``URI@checkpoint-N`` (or ``URI@N``) -> (URI, N); anything else is refused in one line.

    >>> fork_point("s3://b/ckpt/run-1/grpo/gun_control@checkpoint-40")
    ('s3://b/ckpt/run-1/grpo/gun_control', 40)
    >>> fork_point("/runs/a@7")
    ('/runs/a', 7)
    """
    uri, _, step = fork_from.rpartition("@")
    step = step.removeprefix("checkpoint-")
    if not uri or not (step.isascii() and step.isdigit()):
        raise GrailError(
            f"fork_from: {fork_from!r} is not URI@checkpoint-N (another run's checkpoint_uri "
            "and the step to start from)"
        )
    return uri, int(step)


def download_fork_point(fork_from: str, output_dir: str | Path) -> Path:
    """The checkpoint a fork starts from (:func:`fork_point`), a complete upload of the run
    that owns its URI, downloaded into `output_dir` (checked against its marker's sha256)
    unless a complete copy is there already. The other run's URI is only read."""
    uri, step = fork_point(fork_from)
    record = run_record(Location.parse(uri))
    found = complete_checkpoints(uri, record and str(record["run"]))
    if step not in found:
        raise GrailError(
            f"fork_from: {uri} holds no complete checkpoint of step {step} (complete: "
            f"{', '.join(map(str, sorted(found))) or 'none'})"
        )
    location = Location.parse(uri).child(found[step])
    target = Path(output_dir) / found[step]
    listed = listed_files(location)
    if listed is None or not local_copy_matches(target, listed):
        download_into_place(location, target, listed=listed)
    logger.info("forked from %s", location)
    return target


def resume_path(
    resume_from_checkpoint: str | None, checkpoint_uri: str | None, output_dir: str
) -> str | None:
    """What to pass to ``trainer.train(resume_from_checkpoint=...)``.

    ``latest`` means the newest complete checkpoint under ``checkpoint_uri`` (downloaded, or
    found already downloaded), else the newest in ``output_dir``, else a fresh start. Any other
    value is used as given. With several processes, call it on each node's first process
    before the others (``TrainingArguments.main_process_first(local=True)``).
    """
    if resume_from_checkpoint is None:
        return None
    if resume_from_checkpoint != "latest":
        if not (Path(resume_from_checkpoint) / "trainer_state.json").is_file():
            raise GrailError(
                f"resume_from_checkpoint: {resume_from_checkpoint} is not a checkpoint (no "
                "trainer_state.json): name a checkpoint-N folder, or latest"
            )
        given = Path(resume_from_checkpoint).expanduser().resolve()
        if given.parent != Path(output_dir).expanduser().resolve():
            raise GrailError(
                f"resume_from_checkpoint: {resume_from_checkpoint} is not a checkpoint of "
                f"output_dir {output_dir}: a resume continues its own run (another run's "
                "checkpoints and this one's would make one series); to start from another "
                "run's checkpoint, give fork_from and a new output_dir"
            )
        return resume_from_checkpoint
    if checkpoint_uri:
        local = download_latest(checkpoint_uri, output_dir)
        if local is not None:
            logger.info("resuming from %s/%s", checkpoint_uri, local.name)
            return str(local)
    last = last_saved_checkpoint(Path(output_dir))
    if last is not None:
        return str(last)
    logger.info("no checkpoint to resume from: starting fresh")
    return None


def last_saved_checkpoint(output_dir: Path) -> Path | None:
    """The newest ``checkpoint-N`` in `output_dir` whose save finished (the trainer writes
    ``trainer_state.json`` last); a newer one cut short (killed, or out of disk, mid-save) is
    passed over, said, and left for the resumed run to save again.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     for n in (1, 2):
    ...         (Path(d) / f"checkpoint-{n}").mkdir()
    ...     _ = (Path(d) / "checkpoint-1" / "trainer_state.json").write_text("{}")
    ...     last_saved_checkpoint(Path(d)).name
    'checkpoint-1'
    """
    if not output_dir.is_dir():
        return None
    steps = sorted(
        (int(match.group(1)), path)
        for path in output_dir.iterdir()
        if path.is_dir() and (match := CHECKPOINT.match(path.name))
    )
    for _, path in reversed(steps):
        if (path / "trainer_state.json").is_file():
            return path
        logger.warning("%s: its save did not finish (no trainer_state.json): passed over", path)
    return None
