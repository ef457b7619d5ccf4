"""Stage ``export``: the final model, the benchmark outputs and a manifest, to S3 or a folder.

Run: ``grail export --model DIR --benchmark DIR --dest s3://bucket/prefix [--run-id KEY=ID ...]
[--keep-stale]``.

Layout at the destination: ``model/...``, ``benchmark/...`` and ``manifest.json`` (sha256 and
size of every file, source run ids, ``asked_as``: the model's ``prompt.json``, which for the
summarize task pins its reader and judge, and in the pipeline ``promoted`` with the promotion
gate's decision: :mod:`grail.export.promotion`). With ``mlflow_model`` (the pipeline's export
task when it tracks), the destination is also an MLflow model (:func:`write_mlflow_model`):
MLflow's ``MLmodel``, environment files and ``components/`` beside ``model/``, so a model
version can be registered with the destination as its source and nothing copied into MLflow.
What is at the destination is judged by its bytes, as the store reports them: an S3 object's
ETag (the MD5 of its bytes, or of its parts with the part size this module uploads with), a
folder's file by its sha256; never by metadata we wrote ourselves.

Export changes only what an export wrote. Before writing anything it refuses a destination whose
keys would not be stored as typed (:func:`grail.core.storage.check_uri`), one that is, holds or
lies inside a source folder (:func:`check_sources`), and one holding files no export at that
exact destination wrote, another export's among them (:func:`check_foreign`). What an export
wrote is what the previous manifest lists, plus ``manifest.pending.json``'s names while an export is
unfinished (:func:`owned_names`). A rerun uploads only what is missing or differs, verifies every
upload, deletes the files the previous manifest listed that this export no longer holds (unless
``--keep-stale``: the manifest then lists them as ``kept_stale``) and writes the manifest last;
before changing anything it records every name it may write in ``manifest.pending.json`` and
removes the old manifest, so an export killed midway never looks complete and its rerun still
knows its own files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

from grail.core.checkpoints import RUN_RECORD, UPLOAD_STAGING
from grail.core.errors import GrailError
from grail.core.lease import LEASE, Lease, lease_file
from grail.core.outputs import (
    CLAIM,
    LEFTOVER,
    MARKER,
    RESUME_STATE,
    check_complete,
    check_own_folder,
    is_recorded,
    read_benchmark,
    read_record,
    sha256,
    work_folder,
)
from grail.core.storage import (
    Location,
    check_uri,
    list_files,
    s3_client,
    storage_error,
    upload_file,
    write_text,
)

# The markers of the folders exported: each claims its own folder, and the manifest is the
# export's record of what it holds
CLAIMS = (CLAIM, MARKER, LEFTOVER, RUN_RECORD, LEASE)
# a node's checkpoint marker (_COMPLETE.node-K-of-N.json), a claim being written
# (._WRITER.json.PID)
CLAIM_LIKE = re.compile(rf"^(_COMPLETE\.node-\d+-of-\d+\.json|\.{re.escape(CLAIM)}\.\d+)$")


def is_claim(name: str) -> bool:
    """Whether a file name is a claim of another command, which export never copies.

    >>> [is_claim(n) for n in ("_WRITER.json", "_COMPLETE.node-1-of-2.json", "config.json")]
    [True, True, False]
    """
    return name in CLAIMS or CLAIM_LIKE.match(name) is not None


MANIFEST = "manifest.json"
PENDING = "manifest.pending.json"  # what an unfinished export may have written; gone when done
PART = 64 * 1024 * 1024  # the multipart threshold and part size uploads use (ETags depend on it)
logger = logging.getLogger(__name__)


def local_files(sources: dict[str, Path]) -> dict[str, Path]:
    """Destination name -> local file, for every file below each source folder (prefix "":
    at the destination's top)."""
    files = {}
    for prefix, folder in sources.items():
        if not folder.is_dir():
            raise GrailError(f"{folder}: nothing to export (not a folder)")
        written = None
        if (folder / "summary.json").is_file() or (folder / MARKER).is_file():
            written = check_complete(folder)  # a grail output: only a finished one is exported
        for path in sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink()):
            relative = path.relative_to(folder)
            if path.is_symlink():  # its bytes may be anyone's, anywhere: never exported
                raise GrailError(
                    f"{folder}: {relative.as_posix()} is a symbolic link; export copies no "
                    "file from outside the folders it exports: replace it with the file"
                )
            if is_claim(relative.name):
                continue  # another command's claim on its own folder: never the export's
            if (
                relative.parts[0].startswith("checkpoint-")
                or (relative.parts[0] == "sft" and len(relative.parts) > 1)
                or relative.name == "training_args.bin"
                or relative.parts[0].startswith(RESUME_STATE)
                or relative.parts[0] == UPLOAD_STAGING  # an uploader's scratch, if left
            ):  # checkpoints live in checkpoint_uri, the warm start (sft/) is benchmarked
                continue  # beside the run: the final model is enough here
            if written is not None and relative.as_posix() not in written["files"]:
                raise GrailError(  # put there after the output was finished
                    f"{folder}: {relative.as_posix()} was not written by "
                    f"{written.get('stage', 'the stage')} (added since it finished); nothing "
                    "was exported: move it out of the folder"
                )
            files[(Path(prefix) / relative).as_posix()] = path
    return files


def write_mlflow_model(model: Path, work: Path) -> Path:
    """The final model as an MLflow model in ``work/mlflow``, written by MLflow's transformers
    flavour (a text-generation pipeline that ``mlflow.transformers.load_model`` rebuilds):
    ``MLmodel``, the environment files and the tokenizer's ``components/`` beside ``model/``,
    MLflow's local copy of the files :func:`local_files` exports (checkpoints left out)."""
    import importlib.metadata

    import mlflow.transformers

    checkpoint = work / "checkpoint"  # links: MLflow copies the files they point to, once
    for name, path in local_files({"": model}).items():
        (checkpoint / name).parent.mkdir(parents=True, exist_ok=True)
        (checkpoint / name).symlink_to(path.absolute())
    # Given explicitly: MLflow's inference imports torchvision, which a training image lacks.
    requirements = [
        f"{name}=={importlib.metadata.version(name)}"
        for name in ("torch", "transformers", "accelerate")
    ]
    mlflow.transformers.save_model(
        transformers_model=str(checkpoint),
        path=str(work / "mlflow"),
        task="text-generation",
        pip_requirements=requirements,
    )
    return work / "mlflow"


def etag(path: Path) -> str:
    """The ETag S3 gives an upload of this file with our transfer settings: the MD5 of the
    bytes, or, from `PART` bytes on, the MD5 of the parts' MD5s and the part count.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     _ = f.write(b"abc"); f.flush(); etag(Path(f.name))
    '900150983cd24fb0d6963f7d28e17f72'
    """
    size = path.stat().st_size
    with path.open("rb") as handle:
        if size < PART:
            return hashlib.md5(handle.read(), usedforsecurity=False).hexdigest()
        parts = [
            hashlib.md5(b, usedforsecurity=False).digest()
            for b in iter(lambda: handle.read(PART), b"")
        ]
    return f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"


def remote_fingerprint(location: Location) -> str | None:
    """What the store reports for the bytes at the location now; None when nothing is there."""
    if location.scheme == "file":
        return sha256(location.local_path) if location.local_path.is_file() else None
    from botocore.exceptions import ClientError

    try:
        head = s3_client().head_object(Bucket=location.bucket, Key=location.prefix)
    except ClientError as err:
        if err.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    return head["ETag"].strip('"')


def read_manifest(location: Location) -> dict | None:
    """The JSON object stored at the location (a manifest, or `PENDING`); None when there is
    none, or it cannot be read (a warning: an unreadable one is not taken as an export's)."""
    try:
        if location.scheme == "file":
            path = location.local_path
            return json.loads(path.read_text()) if path.is_file() else None
        from botocore.exceptions import ClientError

        try:
            body = s3_client().get_object(Bucket=location.bucket, Key=location.prefix)["Body"]
        except ClientError as err:
            if err.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        manifest = json.loads(body.read())
    except ValueError as err:
        logger.warning("%s: unreadable (%s): not taken as an export's record", location, err)
        return None
    return manifest if isinstance(manifest, dict) else None


def check_sources(location: Location, sources: Iterable[Path]) -> None:
    """Refuse a folder destination that is a source folder, lies inside one or holds one: the
    export would write into what it reads, and its rerun would find the source's files foreign.

    >>> check_sources(Location.parse("/m/out"), [Path("/m")])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    grail.core.errors.GrailError: file:///m/out: is inside the source folder /m; nothing was ...
    """
    if location.scheme != "file":
        return
    dest = location.local_path.resolve()
    for source in sources:
        folder = source.resolve()
        if dest == folder or folder in dest.parents or dest in folder.parents:
            where = "is" if dest == folder else "is inside" if folder in dest.parents else "holds"
            raise GrailError(
                f"{location}: {where} the source folder {source}; nothing was changed: "
                "export to a folder of its own"
            )


def check_no_links(location: Location) -> None:
    """Refuse a folder destination holding a symbolic link anywhere below it (a linked folder,
    a dangling ``manifest.pending.json``): the export's writes would follow it out of the
    destination. The listing never descends into a linked folder, so the foreign-file check
    alone would not see what lies behind it."""
    if location.scheme != "file" or not location.local_path.is_dir():
        return
    root = location.local_path
    for folder, names, files in os.walk(root):  # links are listed, never followed
        for name in sorted([*names, *files]):
            path = Path(folder) / name
            if path.is_symlink():
                raise GrailError(
                    f"{location}: {path.relative_to(root)} is a symbolic link; nothing was "
                    "changed: an export never writes through a link (remove it, or export to "
                    "a folder of its own)"
                )


def check_not_nested(location: Location) -> None:
    """Refuse a destination inside another export (a manifest, or an unfinished export's
    record, in a folder above it): the outer export's rerun would find this one's files
    foreign and stop."""
    parts = location.prefix.strip("/").split("/") if location.scheme == "s3" else None
    if location.scheme == "file":
        path = location.local_path.absolute()
        folders = dict.fromkeys((*path.parents, *path.resolve().parents))  # through links too
        above = [Location.parse(str(p)) for p in folders]
    else:
        above = [
            Location.parse(f"s3://{location.bucket}/{'/'.join(parts[:k])}".rstrip("/"))
            for k in range(len(parts) - 1, -1, -1)
        ]
    for folder in above:
        for record in (MANIFEST, PENDING):
            found = read_manifest(folder.child(record))
            if found is not None and (record == PENDING or isinstance(found.get("files"), dict)):
                raise GrailError(
                    f"{location}: is inside another export ({folder.child(record)}); nothing "
                    "was changed: export to a folder outside it"
                )


def owned_names(location: Location) -> tuple[dict | None, set[str]]:
    """The previous manifest (None when there is none, or it is not an export's) and every name
    an export wrote at this exact destination: the manifest's ``files`` and ``kept_stale``, an
    unfinished export's `PENDING` names, and those two records themselves."""
    previous = read_manifest(location.child(MANIFEST))
    here = str(location)
    if previous is not None and (
        not isinstance(previous.get("files"), dict) or previous.get("destination") != here
    ):
        previous = None  # a manifest.json of something else, or of another place: not ours
    pending = read_manifest(location.child(PENDING))
    if pending is not None and pending.get("destination") != here:
        pending = None  # a record written by hand, or copied: it names nothing of ours
    names = pending.get("names") if pending is not None else None
    owned = (set(previous["files"]) | set(previous.get("kept_stale", []))) if previous else set()
    if isinstance(names, list):  # an unfinished export's: its manifest, however cut short, too
        owned |= {MANIFEST, PENDING} | {n for n in names if isinstance(n, str)}
    if previous is not None:
        owned.add(MANIFEST)
    return previous, owned


def as_exported(location: Location, name: str, previous: dict | None, size: int) -> bool:
    """Whether the file `name` at the destination is still what an export wrote there: the
    previous manifest's sha256 (a folder) or size (S3: its ETag is not a sha256), or, for an
    unfinished export's file the manifest never listed, taken as the export's."""
    files = (previous or {}).get("files", {})
    entry = files.get(name)
    if not isinstance(entry, dict):  # kept_stale or pending: the export's own, by name; a
        return name not in files  # malformed entry of `files` records no file
    if size != entry.get("size"):
        return False
    if location.scheme == "file":
        return sha256(location.child(name).local_path) == entry.get("sha256")
    return True


def check_foreign(location: Location, present: Iterable[str], ours: set[str]) -> None:
    """Refuse a destination holding a file no export here wrote (`ours`: the names it did, and
    files already holding the very bytes this export writes): another export below it first
    (its manifest), else the first such file by name. Nothing is changed before this check."""
    foreign = sorted(set(present) - ours)
    nested = [n for n in foreign if "/" in n and n.rsplit("/", 1)[1] in (MANIFEST, PENDING)]
    if nested:
        raise GrailError(
            f"{location}: holds another export ({nested[0]}); nothing was changed: "
            "export to a folder of its own, not above one"
        )
    if foreign:
        raise GrailError(
            f"{location}: holds files no export here wrote ({foreign[0]}, {len(foreign)} in all); "
            "nothing was changed: export to an empty folder or one an export wrote"
        )


def remove(location: Location) -> None:
    if location.scheme == "file":
        location.local_path.unlink(missing_ok=True)
    else:
        s3_client().delete_object(Bucket=location.bucket, Key=location.prefix)


def put(local: Path, location: Location) -> None:
    """Upload (managed transfer, fixed part size) and verify what the store now holds."""
    if location.scheme == "s3":
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART)
        s3_client().upload_file(str(local), location.bucket, location.prefix, Config=config)
        expected = etag(local)
    else:
        upload_file(local, location)
        expected = sha256(local)
    if remote_fingerprint(location) != expected:
        raise GrailError(f"{location}: the stored bytes differ from {local} after upload")


def export(
    model: str | Path,
    benchmark: str | Path | None,
    dest: str,
    run_ids: dict[str, str] | None = None,
    keep_stale: bool = False,
    mlflow_model: bool = False,
    promotion: dict | None = None,
    checkpoint: str = "last",
) -> dict:
    """Upload what differs, verify it, delete what the previous export here listed and this one
    no longer holds, manifest last; returns the manifest plus what was uploaded, skipped and
    deleted. `mlflow_model`: the model goes as an MLflow model (:func:`write_mlflow_model`)
    whose folder is the destination. A destination refused (:func:`grail.core.storage.check_uri`,
    :func:`check_sources`, :func:`check_foreign`) is a GrailError, with nothing there changed.

    Args:
        model: the final model folder.
        benchmark: the benchmark output folder, or None.
        dest: ``s3://bucket/prefix``, ``file://path`` or a path.
        run_ids: source run ids recorded in the manifest.
        keep_stale: keep what the previous export listed and this one no longer holds.
        mlflow_model: export the model as an MLflow model.
        promotion: the promotion gate's decision (:mod:`grail.export.promotion`), recorded in
            the manifest as ``promoted`` and ``promotion``.
        checkpoint: which of the run's models goes (:func:`exported_checkpoint`): ``last``
            (the model folder), ``best`` (the benchmark's chosen checkpoint) or a step;
            recorded in the manifest as ``exported``.

    Returns:
        ``{"manifest", "uploaded", "skipped", "deleted"}``.
    """
    if dest.startswith("~"):  # a path no shell expanded: a folder named ~ would be made here
        check_own_folder(Path(dest), here=False)
    location = check_uri(dest)
    if location.scheme == "file":
        check_own_folder(location.local_path, here=False)  # its foreign-file check guards .
    check_sources(location, [Path(model), *([Path(benchmark)] if benchmark else [])])
    check_whole_run(Path(model))
    check_benchmarked(Path(model), benchmark)
    model, exported = exported_checkpoint(Path(model), benchmark, checkpoint)
    asked = asked_as(model)  # read before anything is made at the destination
    check_no_links(location)
    try:
        check_not_nested(location)  # reads the store: its errors are one line below
        with work_folder("export") as work:
            if mlflow_model:
                files = local_files({"": write_mlflow_model(Path(model), Path(work))})
            else:
                files = local_files({"model": Path(model)})
            files |= local_files({"benchmark": Path(benchmark)}) if benchmark else {}
            # one writer at a time; a killed export's unfinished uploads are aborted
            with Lease(str(location), purpose="export"):
                extra = {"asked_as": asked, "exported": exported}
                if promotion is not None:
                    extra |= {"promoted": promotion["promoted"], "promotion": promotion}
                return _export(files, location, run_ids or {}, keep_stale, extra)
    except GrailError:
        raise
    except Exception as err:  # botocore: no endpoint, no bucket, access denied, ...
        line = storage_error(err, f"export to {dest}")
        if line is None:
            raise
        raise GrailError(line) from err


def check_whole_run(model: Path) -> None:
    """Refuse a folder inside a finished grail output (a run's ``checkpoint-N`` or ``sft``):
    it has no marker of its own, so nothing of it would be checked; the run is exported whole,
    its checkpoint chosen with ``--checkpoint``, where the run's marker checks it."""
    for folder in Path(model).absolute().parents:
        if (folder / MARKER).is_file():
            inside = Path(model).absolute().relative_to(folder).as_posix()
            raise GrailError(
                f"{model}: is {inside} inside the finished output {folder}, whose marker alone "
                f"records its files; nothing was exported: give --model {folder}"
                + (f" --checkpoint {inside[11:]}" if STEP.fullmatch(inside[11:]) and
                   inside.startswith("checkpoint-") else "")
            )  # fmt: skip


def check_benchmarked(model: Path, benchmark) -> None:
    """Refuse a benchmark that did not score this model: a grail run (a folder with its
    completion marker) goes only with a benchmark whose ``runs`` name that marker's sha256
    (:func:`grail.inference.specs.run_markers`), so that the metrics, the chosen checkpoint
    and the gate's decision exported beside a model are about it, not about another run."""
    if benchmark is None or not (model / MARKER).is_file():
        return
    if not (Path(benchmark) / "metrics.json").is_file():
        return  # not a grail benchmark: local_files exports it as it is
    runs = read_benchmark(Path(benchmark)).get("runs")
    if not isinstance(runs, dict) or sha256(model / MARKER) not in runs.values():
        scored = ", ".join(sorted(runs)) if isinstance(runs, dict) and runs else "no grail run"
        raise GrailError(
            f"{benchmark}: not a benchmark of {model} (it scored {scored}, other bytes or "
            "another run); nothing was exported: give the benchmark of this model"
        )


def exported_checkpoint(model: Path, benchmark, checkpoint: str) -> tuple[Path, dict]:
    """The folder to export and what the manifest says of it (``checkpoint``, ``step``,
    ``reason``): ``last`` is the model folder (the run's final model); a step N is its
    ``checkpoint-N`` folder; ``best`` is the checkpoint the benchmark chose
    (:mod:`grail.core.selection`: the best held-out score, only where it beats the last
    by more than its interval), the model folder when that is the last one or the benchmark
    chose none. A step the model folder does not hold, one that is not a whole number, or a
    checkpoint whose files are not those the run recorded, is refused in one line."""
    chosen = None
    if benchmark is not None and (Path(benchmark) / "metrics.json").is_file():
        chosen = read_benchmark(Path(benchmark)).get("chosen")
    if chosen is not None:
        where = Path(benchmark) / "metrics.json"
        for key in ("step", "last_step"):
            if not is_step(chosen.get(key) if isinstance(chosen, dict) else None):
                raise GrailError(f"{where}: chosen.{key} is not a step number; nothing exported")
    last = chosen["last_step"] if chosen else None
    if checkpoint == "best":
        if chosen is None:
            reason = "the model folder: the benchmark chose no checkpoint"
            return model, {"checkpoint": "best", "step": None, "reason": reason}
        step, reason = chosen["step"], str(chosen.get("reason", ""))
    elif checkpoint == "last":
        return model, {"checkpoint": "last", "step": last, "reason": "the run's final model"}
    elif STEP.fullmatch(checkpoint):
        step, reason = int(checkpoint), f"checkpoint {checkpoint}, as asked"
    else:
        raise GrailError(f"--checkpoint {checkpoint!r}: give best, last or a step number (0-9)")
    record = {"checkpoint": checkpoint, "step": step, "reason": reason}
    if step == last:
        return model, record
    folder = model / f"checkpoint-{step}"
    if not (folder / "config.json").is_file():
        held = sorted(int(p.name[11:]) for p in model.glob("checkpoint-*")
                      if STEP.fullmatch(p.name[11:]))  # fmt: skip
        raise GrailError(
            f"{folder}: no model of step {step} in {model} (its checkpoints: "
            f"{', '.join(map(str, held)) or 'none'}); nothing was exported"
        )
    check_recorded_checkpoint(model, folder.name)
    return folder, record


STEP = re.compile(r"[0-9]+")  # a step as typed: ASCII digits (str.isdigit takes "²" and "١")


def is_step(value) -> bool:
    """Whether a recorded step is one: a whole number, not a bool, not negative.

    >>> [is_step(v) for v in (3, 0, True, -1, 2.0, "1/../../x")]
    [True, True, False, False, False, False]
    """
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_recorded_checkpoint(model: Path, name: str) -> None:
    """Refuse a checkpoint folder of a finished run whose files are not those the run's marker
    recorded (truncated, edited, added or missing since): its model files are exported as they
    stand, and the manifest would call broken bytes a complete export. Checked by sha256 (a
    run's marker hashes its checkpoints' model files; only their resume state goes by size and
    modification time, the latter only in the run's own folder)."""
    if not (model / MARKER).is_file():
        return  # not a grail run's folder: nothing recorded to check against
    written = check_complete(model)
    here = written.get("folder") == str(model.resolve())
    recorded = {k: v for k, v in written["files"].items() if k.startswith(f"{name}/")}
    present = {
        p.relative_to(model).as_posix()
        for p in (model / name).rglob("*")
        if p.is_file() and not is_claim(p.name)
    }
    for entry in sorted(present | set(recorded)):
        if entry not in recorded or not is_recorded(model / entry, recorded[entry], mtime=here):
            raise GrailError(
                f"{model / entry}: not the file the run recorded (missing, changed or added "
                "since it finished); nothing was exported: export another step, or the last"
            )


def asked_as(model: str | Path) -> dict | None:
    """How the model is to be asked (its ``prompt.json``): the summarize task's mode, budget,
    reader and judge, the slate task's prompt options; pinned in the manifest."""
    path = Path(model) / "prompt.json"
    return read_record(path, "a prompt record") if path.is_file() else None


def _export(
    files: dict[str, Path], location: Location, run_ids: dict, keep_stale: bool, extra: dict
) -> dict:
    """The export proper; `extra`: the manifest's other fields (``asked_as``, the promotion),
    each left out when None."""
    entries = {
        name: {"sha256": sha256(path), "size": path.stat().st_size} for name, path in files.items()
    }
    expected = {
        name: (etag(path) if location.scheme == "s3" else entries[name]["sha256"])
        for name, path in files.items()
    }
    differs = [n for n in files if remote_fingerprint(location.child(n)) != expected[n]]
    previous, owned = owned_names(location)
    # S3 folder markers (a console's "create folder": a key ending in "/") are left out: they
    # hold nothing, and the export never writes or deletes them.
    listing = list_files(location)
    present = {n for n in listing if n and not n.endswith("/") and not lease_file(n)}
    check_foreign(location, present, owned | (set(files) - set(differs)))
    changed = [
        n for n in differs if n in present and not as_exported(location, n, previous, listing[n])
    ]
    if changed:  # a file an export wrote, changed since: repaired, and said so
        logger.warning(
            "%s: replaced %s (%d in all): changed since an export wrote it, and this export "
            "writes it anew",
            location,
            changed[0],
            len(changed),
        )
    dropped = sorted((owned & present) - set(files) - {MANIFEST, PENDING})
    edited = [n for n in dropped if not as_exported(location, n, previous, listing[n])]
    if edited and not keep_stale:
        logger.warning(
            "%s: kept %s (%d in all): changed since an export wrote it; no longer the export's, "
            "so the next export here stops until it is moved away",
            location,
            edited[0],
            len(edited),
        )
    dropped = [n for n in dropped if n not in edited]
    stale = [] if keep_stale else dropped
    manifest = {"files": entries, "source_run_ids": run_ids, "destination": str(location)}
    manifest |= {k: v for k, v in extra.items() if v is not None}
    if keep_stale and dropped:
        manifest["kept_stale"] = dropped  # still ours: a later export may delete them
    current = (
        PENDING not in present
        and previous is not None
        and all(
            previous.get(k) == manifest.get(k)
            for k in ("files", "source_run_ids", "destination", "kept_stale", *extra)
        )
    )
    if not differs and not stale and current:
        return {"manifest": previous, "uploaded": [], "skipped": [*files, MANIFEST], "deleted": []}
    check_champion_kept(location, previous, manifest)
    _replace(location, files, differs, stale, manifest)
    return {
        "manifest": manifest,
        "uploaded": [*differs, MANIFEST],
        "skipped": [n for n in files if n not in differs],
        "deleted": stale,
    }


def check_champion_kept(location: Location, previous: dict | None, manifest: dict) -> None:
    """Refuse to change a promoted export: its folder is a registered champion's source, and
    the alias must keep pointing at the bytes the gate judged. Only the same pipeline run
    exporting there again, promoted again (a retried export task: the manifest's
    ``source_run_ids.pipeline``), may rewrite it; an unfinished promoted export (killed,
    its `PENDING` says so) is as promoted as a finished one."""
    if previous is None:  # a killed promoted export leaves its pending record, no manifest
        pending = read_manifest(location.child(PENDING)) or {}
        if pending.get("destination") == str(location) and pending.get("promoted") is True:
            previous = {"promoted": True, "source_run_ids": {"pipeline": pending.get("pipeline")}}
    if previous is None or previous.get("promoted") is not True:
        return
    run = (previous.get("source_run_ids") or {}).get("pipeline")
    if not (run and run == manifest["source_run_ids"].get("pipeline")) or (
        manifest.get("promoted") is not True
    ):
        raise GrailError(
            f"{location}: holds a promoted export (manifest.json: promoted: true, the "
            "registered champion's source); nothing was changed: a promoted export is never "
            "replaced, export to another destination (another run name)"
        )


def _replace(
    location: Location, files: dict[str, Path], differs: list[str], stale: list[str], manifest: dict
) -> None:
    """Write the export in the order that keeps it safe to kill: first `PENDING` with every name
    it may leave behind (a rerun after a kill finds its own files here, not foreign ones), then
    no manifest (it looks unfinished), the uploads, the deletions, the manifest, no `PENDING`."""
    names = sorted({*files, *stale, *manifest.get("kept_stale", [])})
    pending = {"names": names, "destination": str(location)}
    if manifest.get("promoted") is True:  # a promoted export stays one if this is killed
        pending |= {"promoted": True, "pipeline": manifest["source_run_ids"].get("pipeline")}
    write_text(location.child(PENDING), json.dumps(pending))
    remove(location.child(MANIFEST))
    for name in differs:
        put(files[name], location.child(name))
    for name in stale:
        remove(location.child(name))
    manifest["exported_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_text(location.child(MANIFEST), json.dumps(manifest, indent=1, sort_keys=True))
    remove(location.child(PENDING))
