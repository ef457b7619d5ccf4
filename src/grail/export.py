"""Stage ``export``: the final model, the benchmark outputs and a manifest, to S3 or a folder.

Run: ``grail export --model DIR --benchmark DIR --dest s3://bucket/prefix [--run-id KEY=ID ...]``.

Layout at the destination: ``model/...``, ``benchmark/...`` and ``manifest.json`` (sha256 and
size of every file, source run ids), written last. Each S3 object carries its sha256 as object
metadata, so a rerun uploads only what is missing or changed: an interrupted upload (no manifest,
or files missing) is detected and completed, and an unchanged rerun uploads nothing.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from grail.errors import GrailError
from grail.storage import Location, s3_client, upload_file, write_text

MANIFEST = "manifest.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def local_files(sources: dict[str, Path]) -> dict[str, Path]:
    """Destination name -> local file, for every file below each source folder."""
    files = {}
    for prefix, folder in sources.items():
        if not folder.is_dir():
            raise GrailError(f"{folder}: nothing to export (not a folder)")
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            relative = path.relative_to(folder)
            if relative.parts[0].startswith("checkpoint-") or relative.name == "training_args.bin":
                continue  # checkpoints live in checkpoint_uri; the final model is enough here
            files[f"{prefix}/{relative}"] = path
    return files


def remote_digest(location: Location) -> str | None:
    """The sha256 of what is at the location now, or None when nothing is there."""
    if location.scheme == "file":
        return sha256(location.local_path) if location.local_path.is_file() else None
    from botocore.exceptions import ClientError

    try:
        head = s3_client().head_object(Bucket=location.bucket, Key=location.prefix)
    except ClientError as err:
        if err.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    return head.get("Metadata", {}).get("sha256")


def read_manifest(location: Location) -> dict | None:
    """The manifest already at the destination; None when there is none yet."""
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
    return json.loads(body.read())


def put(local: Path, location: Location, digest: str) -> None:
    if location.scheme == "s3":  # managed transfer, sha256 kept as object metadata
        s3_client().upload_file(
            str(local), location.bucket, location.prefix, ExtraArgs={"Metadata": {"sha256": digest}}
        )
    else:
        upload_file(local, location)


def export(
    model: str | Path,
    benchmark: str | Path | None,
    dest: str,
    run_ids: dict[str, str] | None = None,
) -> dict:
    """Upload what changed; returns the manifest plus what was uploaded and skipped."""
    sources = {"model": Path(model)} | ({"benchmark": Path(benchmark)} if benchmark else {})
    files = local_files(sources)
    location = Location.parse(dest)
    uploaded, skipped, entries = [], [], {}
    for name, path in files.items():
        digest = sha256(path)
        entries[name] = {"sha256": digest, "size": path.stat().st_size}
        if remote_digest(location.child(name)) == digest:
            skipped.append(name)
            continue
        put(path, location.child(name), digest)
        uploaded.append(name)
    manifest = {"files": entries, "source_run_ids": run_ids or {}, "destination": str(location)}
    previous = read_manifest(location.child(MANIFEST))
    if (
        uploaded
        or previous is None
        or previous.get("files") != entries
        or previous.get("source_run_ids") != manifest["source_run_ids"]
    ):
        manifest["exported_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        write_text(location.child(MANIFEST), json.dumps(manifest, indent=1, sort_keys=True))
        uploaded.append(MANIFEST)
    else:
        manifest = previous
        skipped.append(MANIFEST)
    return {"manifest": manifest, "uploaded": uploaded, "skipped": skipped}
