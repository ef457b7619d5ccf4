"""One writer per ``checkpoint_uri``: a lease object (``_LEASE.json``) taken with the store's
compare-and-swap and renewed while training runs.

Two trainings on one ``checkpoint_uri`` would overwrite each other's ``checkpoint-N`` (one run's
weights beside the other's optimizer state) and both report success. A training takes the
lease before it reads or writes a checkpoint there; another finding it held refuses with one
line. On S3 the lease is written with conditional requests (``If-None-Match: *`` to create,
``If-Match: ETAG`` to renew, take over or delete: S3's conditional writes, which MinIO and moto
also implement), so of two writers racing for it exactly one wins; its age is the store's own
clock (``Last-Modified`` against the response's ``Date``), so hosts' clocks do not matter. In a
folder (``file://``) an ``flock`` on the folder makes the read-modify-write atomic.

The holder renews every :data:`RENEW` seconds. A training finding the lease held watches it:
renewed, its holder lives and this one is refused; not renewed for :data:`TTL` seconds (30; the
``GRAIL_LEASE_TTL`` environment variable), its holder died (a killed pod) and it is taken over,
so a retried task goes on where its killed attempt stopped and a live holder is never
displaced. Once it holds the lease, a writer aborts the multipart uploads a killed one left
unfinished below the place (their parts are stored, billed and invisible to listings).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import socket
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from email.utils import parsedate_to_datetime

from grail.core.errors import GrailError
from grail.core.storage import Location, abort_incomplete_uploads, s3_client, storage_error

logger = logging.getLogger(__name__)
LEASE = "_LEASE.json"
MIN_TTL = 2.0  # a shorter one would take a live holder's lease between two of its renewals
MAX_TTL = 3600.0  # a longer one would keep a killed holder's retry waiting past an hour


def lease_file(name: str) -> bool:
    """Whether a name in a folder is the lease's: the lease, or the copy a renewal writes beside
    it and renames over it (:meth:`Store._replace`), there for a moment while one runs."""
    return name == LEASE or name.startswith(f".{LEASE}.")


def ttl_from(text: str | None) -> float:
    """The lease's TTL from ``GRAIL_LEASE_TTL`` (seconds; 30 when unset), or a GrailError
    naming the variable: 0 would take a live holder's lease at once, 1e300 would never let a
    dead holder's expire (and overflowed the renewal thread's wait).

    >>> ttl_from(None), ttl_from("6")
    (30.0, 6.0)
    >>> ttl_from("0")
    Traceback (most recent call last):
    grail.core.errors.GrailError: GRAIL_LEASE_TTL='0': expected seconds, from 2 to 3600
    """
    if text is None:
        return 30.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not MIN_TTL <= value <= MAX_TTL:
        raise GrailError(
            f"GRAIL_LEASE_TTL={text!r}: expected seconds, from {MIN_TTL:g} to {MAX_TTL:g}"
        )
    return value


try:  # refused when a lease is taken (a GrailError there), not when grail is imported
    TTL, TTL_PROBLEM = ttl_from(os.environ.get("GRAIL_LEASE_TTL")), None
except GrailError as problem:
    TTL, TTL_PROBLEM = 30.0, str(problem)
RENEW = TTL / 4  # a live holder renews 4 times per TTL
HOLDER = "GRAIL_LEASE_HOLDER"  # set while this process (or its launcher) holds the lease


def pid_namespace() -> str:
    """This process's PID namespace (``/proc/self/ns/pid``): two containers can share a host
    name (host networking) while each numbers its own processes."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def died_here(body: dict) -> bool:
    """Whether a lease's holder was a process of this very host and PID namespace that is gone
    (a killed export or training rerun on the same machine): no need to wait out the TTL."""
    pid = body.get("pid")
    same = body.get("host") == socket.gethostname() and isinstance(pid, int) and pid > 0
    if not (same and body.get("pid_namespace") and body["pid_namespace"] == pid_namespace()):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


class LeaseHeld(GrailError):
    """Another live training holds the lease."""


class Record:
    """The lease as read: its content, a tag for compare-and-swap and its age in seconds (0
    for one dated in the future: a skewed clock, or a copy that kept its modification time)."""

    def __init__(self, body: dict, tag: str, age: float):
        self.body, self.tag, self.age = body, tag, max(age, 0.0)


def _conflict(error) -> bool:
    code = getattr(error, "response", {}).get("Error", {}).get("Code", "")
    return code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "NoSuchKey")


class Store:
    """Compare-and-swap on one object: ``read``, ``write(body, tag)`` (tag None: only if
    absent), ``delete(tag)``; a write or delete whose tag no longer matches returns None/False."""

    def __init__(self, location: Location):
        self.location = location.child(LEASE)

    def read(self) -> Record | None:
        if self.location.scheme == "file":
            path = self.location.local_path
            try:
                text = path.read_bytes()
            except FileNotFoundError:
                return None
            if not text:
                return None
            tag = hashlib.sha256(text).hexdigest()
            return Record(self._parse(text), tag, time.time() - path.stat().st_mtime)
        from botocore.exceptions import ClientError

        try:
            reply = s3_client().get_object(Bucket=self.location.bucket, Key=self.location.prefix)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        now = parsedate_to_datetime(reply["ResponseMetadata"]["HTTPHeaders"]["date"])
        age = (now - reply["LastModified"]).total_seconds()
        return Record(self._parse(reply["Body"].read()), reply["ETag"], age)

    def _parse(self, text: str | bytes) -> dict:
        """The lease's record; a GrailError with the fix when it is not one (a truncated
        write, a file put there by hand)."""
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise GrailError(
                f"{self.location}: not a lease (unreadable); if no training or export is "
                "using this place, delete that file and run again"
            )
        return body

    def write(self, body: dict, tag: str | None) -> str | None:
        text = json.dumps(body)
        if self.location.scheme == "file":
            if self.location.local_path.is_symlink():  # a dangling link would create its target
                raise GrailError(
                    f"{self.location}: is a symbolic link; a lease is never written through one "
                    "(remove it)"
                )
            with self._locked():
                current = self.read()
                if (current.tag if current else None) != tag:
                    return None
                self._replace(text)
                return hashlib.sha256(text.encode()).hexdigest()
        from botocore.exceptions import ClientError

        condition = {"IfMatch": tag} if tag else {"IfNoneMatch": "*"}
        try:
            reply = s3_client().put_object(
                Bucket=self.location.bucket, Key=self.location.prefix, Body=text, **condition
            )
        except ClientError as error:
            if _conflict(error):
                return None
            raise
        return reply["ETag"]

    def delete(self, tag: str) -> bool:
        if self.location.scheme == "file":
            with self._locked():
                current = self.read()
                if current is None or current.tag != tag:
                    return False
                self.location.local_path.unlink()
                return True
        from botocore.exceptions import ClientError

        try:
            s3_client().delete_object(
                Bucket=self.location.bucket, Key=self.location.prefix, IfMatch=tag
            )
        except ClientError as error:
            if _conflict(error):
                return False
            raise
        return True

    def _replace(self, text: str) -> None:
        """The lease file's new content, whole: written beside it, then renamed over it, so a
        reader (``read`` takes no lock) sees the old record or the new one. Written in place,
        a renewal's truncation showed readers an empty file (no holder) or half a record."""
        path = self.location.local_path
        staging = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        try:
            staging.write_text(text)
            os.replace(staging, path)
        finally:
            staging.unlink(missing_ok=True)

    @contextmanager
    def _locked(self):
        folder = self.location.local_path.parent
        folder.mkdir(parents=True, exist_ok=True)
        handle = os.open(folder, os.O_RDONLY)  # the folder itself: no lock file left behind
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            os.close(handle)  # releases the lock


class Lease:
    """The lease on `uri` for this process: :meth:`acquire`, renewed in a thread, :meth:`release`
    (``with Lease(uri):``). ``lost`` turns true if another writer took it over (this process
    stalled past the TTL); the training processes find out before each upload
    (:func:`check_still_held`)."""

    def __init__(self, uri: str, purpose: str = "training"):
        if TTL_PROBLEM:
            raise GrailError(TTL_PROBLEM)
        self.uri = uri
        self.store = Store(Location.parse(uri))
        self.body = {
            "holder": uuid.uuid4().hex,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pid_namespace": pid_namespace(),
            "purpose": purpose,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "renewals": 0,  # each renewal changes the bytes: a watcher sees a live holder
        }
        self.tag: str | None = None
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _describe(self, record: Record) -> str:
        body = record.body
        return (
            f"{self.uri} is in use by another {body.get('purpose', 'training')} (host "
            f"{body.get('host')}, pid {body.get('pid')}, since {body.get('started')}; renewed "
            f"{record.age:.0f} s ago): give this run its own checkpoint_uri, or wait for that "
            f"one to finish (a lease its holder stops renewing expires after {TTL:.0f} s)"
        )

    def try_acquire(self, dead: str | None = None) -> Record | None:
        """Take the lease if it is free or expired, or still the version `dead` (a tag this
        process watched unchanged for a whole TTL: its holder stopped renewing, whatever its
        age says); returns the live record that holds it otherwise (None: it is ours now)."""
        while True:
            current = self.store.read()
            live = current is not None and current.age < TTL and current.tag != dead
            if live and not died_here(current.body):
                return current
            tag = self.store.write(self.body, current.tag if current else None)
            if tag is not None:
                self.tag = tag
                return None
            # another writer changed it between our read and write: read again

    def acquire(self, wait: bool = True) -> None:
        """Take the lease. A held one is watched (with `wait`) until it is renewed (its
        holder lives: refused, LeaseHeld, one line; within :data:`RENEW` seconds) or expires
        (its holder died, e.g. the killed attempt of a retried task: taken over, within
        :data:`TTL` seconds)."""
        holder = self.try_acquire()
        if holder is not None and wait:
            line = (
                f"{self.uri}: held by {holder.body.get('purpose', 'training')} on "
                f"{holder.body.get('host')} (pid {holder.body.get('pid')}, since "
                f"{holder.body.get('started')}); waiting up to {TTL - holder.age:.0f} s to see "
                "whether it is renewed"
            )
            if logger.hasHandlers():
                logger.info(line)
            else:  # logging not set up yet (training sets it up later): said on stderr
                print(f"grail: {line}", file=sys.stderr, flush=True)
            # liveness is the lease's change: one not renewed while this process watches it for
            # a whole TTL is its dead holder's, whatever age its modification time gives it
            # (unchanged at the deadline, it has gone a whole TTL without renewal: the age it
            # had when first seen, counted as 0 when dated in the future, plus the watch)
            deadline = time.monotonic() + max(TTL - holder.age, 0.0)
            while holder is not None:
                time.sleep(min(2.0, max(deadline - time.monotonic(), 0.0)))
                seen = holder
                stale = time.monotonic() >= deadline
                holder = self.try_acquire(dead=seen.tag if stale else None)
                if stale or (holder is not None and holder.tag != seen.tag):
                    break  # taken over, or renewed: its holder is alive
        if holder is not None:
            raise LeaseHeld(self._describe(holder))
        logger.debug("%s: lease taken", self.uri)
        self._thread = threading.Thread(target=self._renew, name="lease-renew", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(RENEW):
            self.body["renewals"] += 1
            tag = self.store.write(self.body, self.tag)
            if tag is None:
                self.lost = True
                logger.error("%s: the lease was taken over by another writer", self.uri)
                return
            self.tag = tag

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.tag is not None and not self.lost:
            self.store.delete(self.tag)
            self.tag = None

    def __enter__(self) -> Lease:
        try:
            self.acquire()
            for key in abort_incomplete_uploads(Location.parse(self.uri)):
                logger.info("aborted the unfinished upload of %s (a killed writer's)", key)
        except Exception as error:  # botocore: no bucket, access denied, no endpoint
            line = storage_error(error, self.uri)
            if line is None:
                raise
            self.release()
            raise GrailError(line) from None
        os.environ[HOLDER] = self.body["holder"]  # the training processes it starts inherit it
        return self

    def __exit__(self, *exc) -> None:
        os.environ.pop(HOLDER, None)
        self.release()


def held_here() -> bool:
    """Whether a process above this one (the pod's launcher, node 0) holds the lease."""
    return bool(os.environ.get(HOLDER))


def check_still_held(uri: str) -> None:
    """Before writing a checkpoint to `uri`: the lease this run took is still its own (another
    training took it over if this one stalled past the TTL); a GrailError otherwise. Nothing
    to check where no lease was taken (``uri`` unset, or a node other than the holder's)."""
    holder = os.environ.get(HOLDER)
    if not holder:
        return
    record = Store(Location.parse(uri)).read()
    if record is None or record.body.get("holder") != holder:
        raise GrailError(
            f"{uri}: another training took over this checkpoint_uri's lease (this one stopped "
            f"renewing it for over {TTL:.0f} s); stopping before writing there"
        )
