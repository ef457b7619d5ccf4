"""Object storage for folders: ``s3://bucket/prefix`` (boto3 managed transfers) or ``file://``.

The S3 endpoint comes from the environment (``AWS_ENDPOINT_URL``, as boto3 reads it; MinIO,
SeaweedFS or moto in tests), credentials from boto3's usual chain: nothing here reads secrets
itself. Used by checkpoint upload/resume and by export.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from grail.core.errors import DataError, GrailError
from grail.core.outputs import replace_file, replace_text

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Location:
    """A parsed storage URI.

    >>> Location.parse("s3://bucket/runs/a/")
    Location(scheme='s3', bucket='bucket', prefix='runs/a')
    >>> Location.parse("file:///tmp/ckpt").local_path
    PosixPath('/tmp/ckpt')
    """

    scheme: str  # "s3" or "file"
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, uri: str) -> Location:
        parsed = urlparse(uri)
        if parsed.scheme == "s3":
            if not parsed.netloc:
                raise GrailError(f"{uri}: an s3 URI needs a bucket (s3://bucket/prefix)")
            return cls("s3", parsed.netloc, parsed.path.strip("/"))
        if parsed.scheme in ("file", ""):
            path = parsed.path if parsed.scheme == "file" else uri
            return cls("file", "", str(Path(path).absolute()))
        raise GrailError(
            f"{uri}: unsupported storage scheme {parsed.scheme!r} (use s3:// or file://)"
        )

    @property
    def local_path(self) -> Path:
        return Path(self.prefix)

    def child(self, name: str) -> Location:
        joined = f"{self.prefix}/{name}" if self.prefix else name
        return Location(self.scheme, self.bucket, joined)

    def __str__(self) -> str:
        return (
            f"s3://{self.bucket}/{self.prefix}" if self.scheme == "s3" else f"file://{self.prefix}"
        )


def s3_client():
    """A boto3 S3 client; endpoint and credentials come from the environment."""
    import boto3

    return boto3.client("s3")


def credentials_origin() -> str:
    """Which credentials boto3 uses, without the secret: the access key's last four characters
    and where boto3 found it (environment variables, a shared credentials file, a role...)."""
    import boto3

    credentials = boto3.Session().get_credentials()
    if credentials is None:
        return "no credentials found (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, the s3 secret)"
    key = credentials.access_key or ""
    method = {"env": "environment variables AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"}.get(
        credentials.method, credentials.method
    )
    return f"access key ...{key[-4:]} from {method}"


def storage_error(error: Exception, where: str) -> str | None:
    """One line for an object-store error (botocore's, boto3's, s3transfer's) about `where`,
    naming what to fix; None for any other error.

    An invalid bucket name says which rule it breaks (botocore puts that on its second line);
    access denied names the credentials used; an unknown bucket and an unreachable endpoint
    say so."""
    from grail.core.errors import mask_secrets

    if type(error).__module__.split(".")[0] not in ("botocore", "boto3", "s3transfer"):
        return None
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = " ".join(lines) or type(error).__name__
    response = getattr(error, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in ("403", "AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        text = f"access denied ({code}) with {credentials_origin()}: check that they may use it"
    elif code in ("NoSuchBucket",) or (status == 404 and "bucket" in text.lower()):
        text = "no such bucket: create it, or fix the bucket's name"
    elif type(error).__name__ == "NoCredentialsError":
        text = f"{credentials_origin()}: set them (locally) or mount the s3 secret (on a cluster)"
    elif type(error).__name__ == "EndpointConnectionError":
        text += " (AWS_ENDPOINT_URL: is the object store running and reachable?)"
    return mask_secrets(f"{where}: {text}")


def upload_file(local: Path, location: Location) -> None:
    if location.scheme == "s3":
        s3_client().upload_file(str(local), location.bucket, location.prefix)
    else:
        replace_file(location.local_path, lambda staged: shutil.copy2(local, staged))


def abort_incomplete_uploads(location: Location) -> list[str]:
    """Abort the multipart uploads left unfinished below `location` (a writer killed midway:
    their parts are stored and billed, invisible to listings); returns their keys. Call it
    only while holding the place's lease: an upload in progress is then a dead writer's."""
    if location.scheme != "s3":
        return []
    from botocore.exceptions import ClientError

    client = s3_client()
    prefix = f"{location.prefix}/" if location.prefix else ""
    aborted = []
    try:
        for page in client.get_paginator("list_multipart_uploads").paginate(
            Bucket=location.bucket, Prefix=prefix
        ):
            for upload in page.get("Uploads", []):
                client.abort_multipart_upload(
                    Bucket=location.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
                aborted.append(upload["Key"])
    except (
        ClientError
    ) as error:  # a policy without s3:ListBucketMultipartUploads/AbortMultipartUpload
        if error.response.get("Error", {}).get("Code") not in ("AccessDenied", "403"):
            raise
        logger.warning(
            "%s: cannot list or abort unfinished uploads (%s): a bucket lifecycle rule "
            "(AbortIncompleteMultipartUpload) can clear them instead",
            location,
            error.response["Error"]["Code"],
        )
    return aborted


def upload_folder(local: Path, location: Location) -> list[str]:
    """Upload every file below `local` (relative names kept); returns the names uploaded."""
    names = sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())
    for name in names:
        upload_file(local / name, location.child(name))
    return names


def list_files(location: Location) -> dict[str, int]:
    """Relative name -> size of every object below the location."""
    if location.scheme == "file":
        root = location.local_path
        if not root.is_dir():
            return {}
        return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}
    paginator = s3_client().get_paginator("list_objects_v2")
    prefix = f"{location.prefix}/" if location.prefix else ""
    found = {}
    for page in paginator.paginate(Bucket=location.bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            found[item["Key"][len(prefix) :]] = item["Size"]
    return found


def inside(local: Path, name: str, source: Location) -> Path:
    """Where object `name` goes below `local`; a key that would land anywhere else (``../``,
    an absolute key, a symlink out) is refused: a bucket must not write outside the folder.

    >>> str(inside(Path("/d"), "a/b.txt", Location.parse("s3://b/p")))
    '/d/a/b.txt'
    >>> inside(Path("/d"), "../../etc/x", Location.parse("s3://b/p"))
    Traceback (most recent call last):
    grail.core.errors.DataError: s3://b/p: key ../../etc/x: refused, it would be written outside /d
    """
    root = local.resolve()
    target = (root / name).resolve()
    if name.startswith("/") or (target != root and root not in target.parents):
        raise DataError(f"key {name}: refused, it would be written outside {local}", file=source)
    return target


def download_folder(location: Location, local: Path) -> list[str]:
    """Download every object below the location into `local`; returns the names."""
    names = sorted(list_files(location))
    targets = {name: inside(local, name, location) for name in names}  # all checked first
    for name in names:
        target = targets[name]
        target.parent.mkdir(parents=True, exist_ok=True)
        if location.scheme == "s3":
            s3_client().download_file(location.bucket, location.child(name).prefix, str(target))
        else:
            source = location.local_path / name
            replace_file(target, lambda staged, source=source: shutil.copy2(source, staged))
    return names


def read_text(location: Location) -> str:
    if location.scheme == "file":
        return location.local_path.read_text()
    body = s3_client().get_object(Bucket=location.bucket, Key=location.prefix)["Body"]
    return body.read().decode()


def write_text(location: Location, text: str) -> None:
    if location.scheme == "file":
        replace_text(location.local_path, text)
    else:
        s3_client().put_object(Bucket=location.bucket, Key=location.prefix, Body=text.encode())


def check_run_name(run: str, what: str) -> str:
    """A run name or key that becomes one folder name (`what` names it in the error): not
    empty, no ``/`` or ``\\``, not ``.`` or ``..``; checked when a run starts.

    >>> check_run_name(" r1/ ", "run name")
    'r1'
    >>> check_run_name("../../../escape2", "run name")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    grail.core.errors.GrailError: run name '../../../escape2': give a run id or a name ...
    """
    run = run.strip().strip("/")
    if not run or "/" in run or "\\" in run or run in (".", ".."):
        raise GrailError(f"{what} {run!r}: give a run id or a name without '/'")
    return run


def run_folder(root: str, run: str, what: str, algorithm: str, issue: str) -> str:
    """``root/RUN/ALGORITHM/ISSUE``: one run's place for one branch (`what` names the run
    part in the error when it is empty or not one folder name)."""
    run = check_run_name(run, what)
    return f"{root.rstrip('/')}/{run}/{algorithm}/{issue}"


def check_uri(dest: str) -> Location:
    """A destination (an export's, checkpoints'), parsed once its keys are known to land where
    they are named: no ``..`` segment (S3 stores it as a literal key; in a path it leaves the
    folder named) and, in an s3 key, no leading ``/``, empty or ``.`` segment; no ``?`` or
    ``#``, which parsing drops, nor a ``file://`` host (``file://out`` would be the current
    folder).

    >>> check_uri("s3://b/exports/run-1/")
    Location(scheme='s3', bucket='b', prefix='exports/run-1')
    >>> check_uri("s3://b/a/../../c")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    grail.core.errors.GrailError: s3://b/a/../../c: a '..' segment in the key is refused (...
    """
    parsed = urlparse(dest)
    if parsed.scheme in ("s3", "file") and (parsed.query or parsed.fragment):
        raise GrailError(f"{dest}: '?' and '#' are refused in the destination (parsing drops them)")
    if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
        raise GrailError(f"{dest}: file:// takes an absolute path (file:///path); give the path")
    if parsed.scheme != "s3":
        path = parsed.path if parsed.scheme == "file" else dest
        if ".." in path.split("/"):
            raise GrailError(f"{dest}: a '..' segment is refused; name the folder itself")
        return Location.parse(dest)
    key = parsed.path[1:]  # what follows s3://bucket/
    if key.startswith("/"):
        raise GrailError(f"{dest}: a key starting with '/' is refused; write s3://bucket/prefix")
    for segment in key.rstrip("/").split("/") if key else []:
        if segment in ("", ".", ".."):
            what = f"a {segment!r}" if segment else "an empty"
            raise GrailError(
                f"{dest}: {what} segment in the key is refused (S3 stores it as written, it "
                "does not go up or collapse); name the prefix itself"
            )
    return Location.parse(dest)
