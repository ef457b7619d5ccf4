"""Stage ``export``: the final model, the benchmark outputs and a manifest, to S3 or a folder.

Run: ``grail export --model DIR --benchmark DIR --dest s3://bucket/prefix [--run-id KEY=ID ...]
[--keep-stale]``.

Layout at the destination: ``model/...``, ``benchmark/...`` and ``manifest.json`` (sha256 and
size of every file, source run ids). With ``mlflow_model`` (the pipeline's export task when it
tracks), the destination is also an MLflow model (:func:`write_mlflow_model`): MLflow's
``MLmodel``, environment files and ``components/`` beside ``model/``, so a model version can be
registered with the destination as its source and nothing copied into MLflow. What is at the
destination is judged by its bytes, as the store reports them: an S3 object's ETag (the MD5 of
its bytes, or of its parts with the part size this module uploads with), a folder's file by its
sha256; never by metadata we wrote ourselves.
A rerun uploads only what is missing or differs, verifies every upload, deletes objects no longer
exported (unless ``--keep-stale``) and writes the manifest last; before changing anything it
removes the old manifest, so an export killed midway never looks complete. An unreadable old
manifest is replaced, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from grail.core.config import option
from grail.core.errors import GrailError, mask_secrets
from grail.core.outputs import MARKER, check_complete
from grail.core.storage import Location, list_files, s3_client, upload_file, write_text

MANIFEST = "manifest.json"
PART = 64 * 1024 * 1024  # the multipart threshold and part size uploads use (ETags depend on it)
logger = logging.getLogger(__name__)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def local_files(sources: dict[str, Path]) -> dict[str, Path]:
    """Destination name -> local file, for every file below each source folder (prefix "":
    at the destination's top)."""
    files = {}
    for prefix, folder in sources.items():
        if not folder.is_dir():
            raise GrailError(f"{folder}: nothing to export (not a folder)")
        if (folder / "summary.json").is_file() or (folder / MARKER).is_file():
            check_complete(folder)  # a grail output: only a finished one is exported
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            relative = path.relative_to(folder)
            if relative.parts[0].startswith("checkpoint-") or relative.name == "training_args.bin":
                continue  # checkpoints live in checkpoint_uri; the final model is enough here
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
    """The manifest already at the destination; None when there is none yet, or it cannot be
    read (a warning: the export replaces it)."""
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
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        logger.warning("%s: unreadable manifest (%s): replacing it", location, err)
        return None
    return manifest if isinstance(manifest, dict) else None


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


@dataclass(kw_only=True)
class ExportConfig:
    """grail export: the model, its benchmark and a manifest to S3 or a folder."""

    model: str = option("Final model folder.")
    benchmark: str | None = option("Benchmark output folder.", None)
    dest: str = option("s3://bucket/prefix, file://path or a path.")
    keep_stale: bool = option(
        "Keep objects at the destination that this export no longer contains.", False
    )
    run_ids: list[str] = option(
        "Source run ids recorded in the manifest; repeatable.",
        [],
        aliases=["--run-id", "--run_id"],
        action="extend",
        metavar="KEY=ID",
    )


def export(
    model: str | Path,
    benchmark: str | Path | None,
    dest: str,
    run_ids: dict[str, str] | None = None,
    keep_stale: bool = False,
    mlflow_model: bool = False,
) -> dict:
    """Upload what differs, verify it, delete what is no longer exported, manifest last;
    returns the manifest plus what was uploaded, skipped and deleted. `mlflow_model`: the model
    goes as an MLflow model (:func:`write_mlflow_model`) whose folder is the destination."""
    try:
        with tempfile.TemporaryDirectory(prefix="grail-export-") as work:
            if mlflow_model:
                files = local_files({"": write_mlflow_model(Path(model), Path(work))})
            else:
                files = local_files({"model": Path(model)})
            files |= local_files({"benchmark": Path(benchmark)}) if benchmark else {}
            return _export(files, dest, run_ids or {}, keep_stale)
    except GrailError:
        raise
    except Exception as err:  # botocore: no endpoint, no bucket, access denied, ...
        if type(err).__module__.split(".")[0] not in ("botocore", "boto3", "s3transfer"):
            raise
        raise GrailError(f"export to {dest}: {mask_secrets(str(err).splitlines()[0])}") from err


def _export(files: dict[str, Path], dest: str, run_ids: dict, keep_stale: bool) -> dict:
    location = Location.parse(dest)
    entries = {
        name: {"sha256": sha256(path), "size": path.stat().st_size} for name, path in files.items()
    }
    expected = {
        name: (etag(path) if location.scheme == "s3" else entries[name]["sha256"])
        for name, path in files.items()
    }
    differs = [n for n in files if remote_fingerprint(location.child(n)) != expected[n]]
    stale = [] if keep_stale else sorted(set(list_files(location)) - set(files) - {MANIFEST})
    previous = read_manifest(location.child(MANIFEST))
    manifest = {"files": entries, "source_run_ids": run_ids, "destination": str(location)}
    current = previous is not None and all(
        previous.get(k) == manifest[k] for k in ("files", "source_run_ids", "destination")
    )
    if not differs and not stale and current:
        return {"manifest": previous, "uploaded": [], "skipped": [*files, MANIFEST], "deleted": []}
    remove(location.child(MANIFEST))  # from here until the end, the export looks unfinished
    for name in differs:
        put(files[name], location.child(name))
    for name in stale:
        remove(location.child(name))
    manifest["exported_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_text(location.child(MANIFEST), json.dumps(manifest, indent=1, sort_keys=True))
    skipped = [n for n in files if n not in differs]
    return {
        "manifest": manifest,
        "uploaded": [*differs, MANIFEST],
        "skipped": skipped,
        "deleted": stale,
    }
