"""One writer per checkpoint_uri (grail.core.lease): the probe's two trainings on one
checkpoint_uri lost run B's checkpoints while both reported success. The races run for real:
several processes against moto's S3 server and a folder, many rounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from tiny_settings import tiny_args

from grail.core import lease as lease_module
from grail.core.checkpoints import complete_checkpoints
from grail.core.errors import GrailError
from grail.core.lease import LEASE, Lease, LeaseHeld, Store, check_still_held
from grail.core.storage import Location

HOLD = Path(__file__).resolve().parent / "hold"  # sitecustomize: stop after a save


def _grab(uri: str) -> bool:
    """In a process of its own: whether this process took the lease (kept, not released)."""
    return Lease(uri).try_acquire() is None


@pytest.mark.parametrize("scheme", ["s3", "file"])
def test_of_processes_racing_for_a_free_lease_exactly_one_wins(scheme, s3, tmp_path):
    with ProcessPoolExecutor(4) as pool:
        for round_ in range(12):
            uri = f"s3://{s3}/race/{round_}" if scheme == "s3" else f"file://{tmp_path}/{round_}"
            won = list(pool.map(_grab, [uri] * 4))
            assert sum(won) == 1, (round_, won)


def test_a_live_lease_is_refused_an_expired_one_taken_over_and_release_frees_it(s3, monkeypatch):
    uri = f"s3://{s3}/ckpt"
    first = Lease(uri)
    first.acquire()
    try:
        with pytest.raises(LeaseHeld, match=f"{uri} is in use by another training"):
            Lease(uri).acquire(wait=False)
        # The holder dies (no renewal, no release): once its lease is older than the TTL the
        # next training takes it over, and the dead holder can no longer write there.
        first._stop.set()
        monkeypatch.setattr(lease_module, "TTL", 1.0)
        time.sleep(1.5)
        second = Lease(uri)
        second.acquire(wait=False)
        assert Store(Location.parse(uri)).read().body["holder"] == second.body["holder"]
        monkeypatch.setenv(lease_module.HOLDER, first.body["holder"])
        with pytest.raises(GrailError, match="another training took over"):
            check_still_held(uri)
        second.release()
        assert Store(Location.parse(uri)).read() is None
    finally:
        first._stop.set()


def test_a_renewing_holder_is_never_displaced_by_a_waiting_one(
    tmp_path, monkeypatch, capsys, caplog
):
    """A lease not clearly alive is watched: renewed meanwhile means its holder lives. The
    waiter says who holds it (before, `grail train` printed nothing: logging came later)."""
    caplog.set_level("INFO", logger="grail.core.lease")
    monkeypatch.setattr(lease_module, "TTL", 2.0)
    monkeypatch.setattr(lease_module, "RENEW", 0.3)
    uri = f"file://{tmp_path}/ckpt"
    holder = Lease(uri)
    holder.acquire()
    try:
        time.sleep(0.6)
        with pytest.raises(LeaseHeld):
            Lease(uri).acquire(wait=True)
        assert not holder.lost
    finally:
        holder.release()
    said = capsys.readouterr().err + caplog.text  # stderr, or the log once one is set up
    lines = [x for x in said.splitlines() if "held by" in x]
    assert lines, said
    assert f"{uri}: held by training on" in lines[0] and f"pid {os.getpid()}" in lines[0]
    assert "waiting up to" in lines[0]


def test_a_second_training_on_one_checkpoint_uri_is_refused_and_a_retry_takes_over(
    s3, tmp_path, tiny_policy, small_clean
):
    """Training A holds after step 2's save (tests/hold). Training B on the same
    checkpoint_uri exits 2 with one line naming the uri and the holder, writing nothing. A is
    killed (its lease stays, unrenewed); its retry takes the lease over once it has expired and
    resumes from A's checkpoint-2."""
    uri = f"s3://{s3}/shared"
    common = ["--max_steps", "4", "--save_steps", "2", "--checkpoint_uri", uri]
    common += ["--resume_from_checkpoint", "latest"]
    a = tiny_args(small_clean, tiny_policy, tmp_path / "a", *common)
    b = tiny_args(small_clean, tiny_policy, tmp_path / "b", *common)
    command = [sys.executable, "-m", "grail.cli", "train"]
    hold = os.environ | {"PYTHONPATH": str(HOLD), "GRAIL_TEST_HOLD_AFTER_SAVE": "2"}
    first = subprocess.Popen(
        [*command, *a], env=hold, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 300
        while 2 not in complete_checkpoints(uri):
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        second = subprocess.run([*command, *b], capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr[-2000:]
        (line,) = [x for x in second.stderr.splitlines() if x.startswith("grail: error:")]
        assert f"{uri} is in use by another training" in line and "pid" in line, line
        assert not (tmp_path / "b").exists() or not list((tmp_path / "b").iterdir())
        assert sorted(complete_checkpoints(uri)) == [2]
    finally:
        first.kill()
        first.wait()
    retry = subprocess.run([*command, *a], capture_output=True, text=True, timeout=600)
    assert retry.returncode == 0, retry.stderr[-3000:]
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["global_step"] == 4 and summary["resumed_from"].endswith("checkpoint-2")
    assert Store(Location.parse(uri)).read() is None, f"{LEASE} released at the end"


@pytest.mark.parametrize("body", ["{not json", "[1, 2]", "\xff\xfe"])
def test_a_corrupt_lease_is_one_line_with_the_fix(tmp_path, capsys, tiny_policy, small_clean, body):
    """Before: a JSON trace on every retry."""
    from grail.cli import main

    store = tmp_path / "store"
    store.mkdir()
    (store / LEASE).write_bytes(body.encode("latin-1"))
    argv = tiny_args(small_clean, tiny_policy, tmp_path / "out", "--checkpoint_uri", str(store))
    assert main(["train", *argv]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{LEASE}: not a lease (unreadable)" in last and "delete that file" in last, last


def test_each_renewal_changes_the_lease_so_a_watcher_sees_its_holder_live(tmp_path, monkeypatch):
    """Before: a renewal rewrote identical bytes, so in a folder (whose tag is the content's
    sha256) a live holder looked dead until the whole TTL had passed."""
    monkeypatch.setattr(lease_module, "RENEW", 0.2)
    uri = f"file://{tmp_path}/ckpt"
    holder = Lease(uri)
    holder.acquire()
    try:
        tags = set()
        for _ in range(4):
            tags.add(Store(Location.parse(uri)).read().tag)
            time.sleep(0.3)
        assert len(tags) >= 3, tags
    finally:
        holder.release()


def test_a_reader_never_sees_a_lease_half_written(tmp_path):
    """Before: a renewal truncated the lease file and wrote it again, and readers (who take no
    lock) saw an empty file, so no holder, in 60% of reads made during renewals."""
    store = Store(Location.parse(f"file://{tmp_path}/ckpt"))
    tag = store.write({"holder": "a", "renewal": 0}, None)
    seen, done = [], threading.Event()

    def read_while_renewed():
        while not done.is_set():
            try:
                record = store.read()
                seen.append(record.body["holder"] if record else None)
            except GrailError as error:
                seen.append(str(error))

    reader = threading.Thread(target=read_while_renewed)
    reader.start()
    try:
        for renewal in range(1, 300):
            tag = store.write({"holder": "a", "renewal": renewal, "pad": "x" * 300}, tag)
            assert tag
    finally:
        done.set()
        reader.join()
    assert seen and set(seen) == {"a"}, {s for s in seen if s != "a"}
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == [LEASE]  # no copy left behind


@pytest.mark.parametrize("value", ["0", "abc", "-5", "nan", "1", "1e300", "3601"])
def test_the_lease_ttl_is_validated(value):
    """Before: GRAIL_LEASE_TTL=0 took a live holder's lease at once, `abc` was a trace."""
    code = (
        "import sys\nfrom grail.core.lease import Lease\nfrom grail.core.errors import GrailError\n"
        "try:\n    Lease('file:///tmp/x')\nexcept GrailError as e:\n    print(e); sys.exit(2)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=os.environ | {"GRAIL_LEASE_TTL": value},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert f"GRAIL_LEASE_TTL={value!r}: expected seconds, from 2 to 3600" in done.stdout


def test_a_lease_that_is_a_link_is_never_written_through(tmp_path):
    outside = tmp_path / "outside.json"
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / LEASE).symlink_to(outside)
    with pytest.raises(GrailError, match="is a symbolic link; a lease is never written through"):
        Lease(f"file://{tmp_path}/ckpt").acquire(wait=False)
    assert not outside.exists()


def test_a_dead_holder_s_lease_dated_in_the_future_is_taken_over_within_the_ttl(
    tmp_path, monkeypatch
):
    """The probe: a dead holder's `_LEASE.json` with a modification time an hour ahead (clock
    skew, or a copy keeping mtimes) kept `grail export` waiting 3,601 s. Its age counts as 0,
    and a lease that does not change while watched for a whole TTL is taken over."""
    monkeypatch.setattr(lease_module, "TTL", 2.0)
    uri = f"file://{tmp_path}/ckpt"
    dead = Lease(uri)
    assert dead.try_acquire() is None  # taken, never renewed: its holder died
    path = tmp_path / "ckpt" / LEASE
    ahead = time.time() + 3600
    os.utime(path, (ahead, ahead))
    assert Store(Location.parse(uri)).read().age == 0
    started = time.monotonic()
    second = Lease(uri)
    second.acquire(wait=True)
    try:
        assert time.monotonic() - started < 2.0 + 0.5  # the TTL, never more
        assert Store(Location.parse(uri)).read().body["holder"] == second.body["holder"]
    finally:
        second.release()


def test_a_killed_holder_on_this_machine_is_taken_over_at_once(tmp_path):
    """The probe: a rerun after a killed export waited the whole TTL (30 s) for a lease whose
    holder was this host and a pid that no longer runs. A holder of this host and PID
    namespace that is gone is taken over at once; a live one is still waited for."""
    from holders import holding

    uri = f"file://{tmp_path}/dest"
    holder = holding(
        "from grail.core.lease import Lease\n"
        f"assert Lease({uri!r}, purpose='export').try_acquire() is None"
    )
    with pytest.raises(LeaseHeld, match="in use by another export"):
        Lease(uri).acquire(wait=False)  # alive: refused
    holder.kill()
    holder.wait()
    started = time.monotonic()
    second = Lease(uri)
    second.acquire(wait=True)
    try:
        assert time.monotonic() - started < 2.0
        assert Store(Location.parse(uri)).read().body["holder"] == second.body["holder"]
    finally:
        second.release()
