"""Stage outputs are complete or absent: a clean killed at any moment leaves the previous output
whole, two cleans into one folder cannot interleave, and a half-written folder is refused."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grail.clean.stage import clean
from grail.core.errors import DataError
from grail.core.outputs import check_complete, check_owned
from grail.tasks.slate.contract import read_dataset


def _clean(raw: Path, out: Path, seed: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "grail.cli", "clean", "--raw", str(raw), "--out", str(out)]
        + ["--seed", str(seed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _seed(out: Path) -> int:
    check_complete(out)
    read_dataset(out)  # every file readable and within the contract
    return json.loads((out / "audit.json").read_text())["accounting"]["settings"]["seed"]


# The three tests below kill cleans at chosen moments (about 40 s together): the integration
# tier, beside the other tests that start grail's processes, so the unit tier has its time for
# the learnability guard
@pytest.mark.integration
def test_a_clean_killed_at_any_moment_leaves_the_previous_output_whole(default_study, tmp_path):
    out = tmp_path / "data"
    clean(default_study, out, seed=1)
    outcomes = set()
    for delay in (0.2, 0.6, 1.0, 1.4, 1.8, 2.2, 2.6, 3.2):
        process = _clean(default_study, out, seed=2)
        time.sleep(delay)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        outcomes.add(_seed(out))  # the old output or the new one, whole, never a mix
        if _seed(out) == 2:
            clean(default_study, out, seed=1)
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".data.writing-")]
    assert 1 in outcomes


@pytest.mark.integration
def test_the_next_clean_removes_what_killed_ones_left(default_study, tmp_path):
    """SIGKILL leaves a clean no chance to tidy up: its staging folder stays beside the output
    (the probe found them kept by every rerun). The next clean removes them; a live writer's
    staging is never touched (two cleans at once still both finish)."""
    out = tmp_path / "data"
    clean(default_study, out, seed=1)
    for _ in range(2):
        process = _clean(default_study, out, seed=2)
        deadline = time.monotonic() + 120
        before = set(tmp_path.glob(".data.writing-*/_LEFTOVER.json"))
        while (
            not set(tmp_path.glob(".data.writing-*/_LEFTOVER.json")) - before
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)  # killed once its staging folder is there, however busy the CPU
        process.kill()
        process.wait(timeout=60)
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".data.")]
    assert left, "nothing was left to clean up: the kills came too late"
    clean(default_study, out, seed=1)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".data.")] == []
    assert _seed(out) == 1


@pytest.mark.integration
def test_two_cleans_into_one_folder_cannot_interleave(default_study, tmp_path):
    out = tmp_path / "data"
    first, second = _clean(default_study, out, 1), _clean(default_study, out, 2)
    assert first.wait(timeout=120) == 0 and second.wait(timeout=120) == 0
    assert _seed(out) in (1, 2)


def test_stale_files_of_an_earlier_output_do_not_survive(default_study, tiny_raw, tmp_path):
    out = tmp_path / "data"
    clean(default_study, out)
    assert (out / "truth_steps.csv").is_file()
    clean(tiny_raw, out)  # a raw folder without truth files
    assert not (out / "truth_steps.csv").exists()


def test_a_folder_without_its_marker_or_with_a_changed_file_is_refused(default_clean, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(default_clean, copy)
    with (copy / "train.parquet").open("ab") as handle:
        handle.write(b"x")
    with pytest.raises(DataError, match="train.parquet is not the file clean wrote"):
        read_dataset(copy)
    (copy / "_COMPLETE.json").unlink()
    with pytest.raises(DataError, match="no _COMPLETE.json"):
        read_dataset(copy)


def test_a_same_size_edit_is_a_changed_file(default_clean, tmp_path):
    """The probe's case: one digit of truth_steps.csv changed (same size) moved the reported
    ceiling; the marker's sha256 refuses it where sizes could not."""
    copy = tmp_path / "copy"
    shutil.copytree(default_clean, copy)
    path = copy / "truth_steps.csv"
    text = path.read_text()
    index = next(i for i, c in enumerate(text) if c in "12345678")
    path.write_text(text[:index] + str(int(text[index]) + 1) + text[index + 1 :])
    assert path.stat().st_size == (default_clean / "truth_steps.csv").stat().st_size
    with pytest.raises(DataError, match="truth_steps.csv is not the file clean wrote"):
        read_dataset(copy)


def test_an_out_path_that_is_a_file_is_one_line(tiny_raw, tmp_path):
    (tmp_path / "file").write_text("x")
    done = subprocess.run(
        [sys.executable, "-m", "grail.cli", "clean", "--raw", str(tiny_raw), "--out"]
        + [str(tmp_path / "file")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "exists and is not a folder" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "--model", "{model}", "--dest", "{file}"],
        ["export", "--model", "{model}", "--dest", "{file}/sub"],
        ["export", "--model", "{model}", "--dest", "file://{file}/sub"],
        ["clean", "--raw", "{raw}", "--out", "{file}/sub"],
        ["simulate", "--participants", "5", "--out", "{file}/sub"],
    ],
)
def test_an_out_below_a_file_is_one_line_naming_the_file(tiny_raw, tmp_path, error_line, argv):
    """A destination that is a file, or a path below one, was ``_LEASE.json: Not a
    directory`` (export) or ``File exists`` (the first mkdir): one line naming the file."""
    file, model = tmp_path / "file", tmp_path / "model"
    file.write_text("x")
    model.mkdir()
    (model / "config.json").write_text("{}")
    names = {"file": file, "model": model, "raw": tiny_raw}
    line = error_line([a.format(**names) for a in argv])
    assert f"{file}: exists and is not a folder" in line, line
    assert file.read_text() == "x"


@pytest.mark.parametrize(
    "argv",
    [
        ["clean", "--raw", "{raw}", "--out", "{raw}/inside"],
        ["simulate", "--participants", "5", "--out", "{clean}/inside"],
        ["tiny-model", "--out", "{run}/inside"],
        ["export", "--model", "{model}", "--dest", "{clean}/inside"],
    ],
)
def test_no_command_writes_inside_another_commands_output(tiny_raw, tmp_path, error_line, argv):
    """``clean --out raw/c``, ``benchmark --out RUN/b``, ``tiny-model --out RUN/t``: each
    wrote a folder the finished output's marker does not list (probe B5), and that output
    could not be exported or read until it was moved by hand. A folder below a finished output
    (its marker) or below a training's claim is refused, with nothing written."""
    from grail.core.outputs import CLAIM, mark_complete

    clean, run, model = tmp_path / "clean", tmp_path / "run", tmp_path / "model"
    for folder in (clean, run, model):
        folder.mkdir()
    (model / "config.json").write_text("{}")
    mark_complete(clean, "clean")
    (run / CLAIM).write_text('{"command": "train"}')  # a training's folder, written in place
    raw = Path(shutil.copytree(tiny_raw, tmp_path / "raw-copy"))
    mark_complete(raw, "simulate")
    names = {"raw": raw, "clean": clean, "run": run, "model": model}
    line = error_line([a.format(**names) for a in argv])
    assert "/inside: is inside " in line and "nothing was written" in line, line
    assert not any(p.name == "inside" for p in tmp_path.rglob("*"))


def test_a_folder_no_stage_wrote_is_never_replaced(tiny_raw, tmp_path):
    """`--out` naming a folder of someone's files (a source folder such as bench/) is refused in
    one line, and every file there stays as it was."""
    mine = tmp_path / "bench"
    mine.mkdir()
    (mine / "benchmark.py").write_text("print('tracked')\n")
    done = subprocess.run(
        [sys.executable, "-m", "grail.cli", "clean", "--raw", str(tiny_raw), "--out", str(mine)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert "holds files that no grail stage wrote" in done.stderr
    assert "Traceback" not in done.stderr
    assert [p.name for p in mine.iterdir()] == ["benchmark.py"]
    assert (mine / "benchmark.py").read_text() == "print('tracked')\n"


@pytest.mark.parametrize(
    "claim",
    [
        ("_WRITER.json", {"command": "clean"}),
        ("_WRITER.json", {"command": "train"}),
        ("_COMPLETE.json", {"stage": "clean"}),  # a marker without a file list
        ("_COMPLETE.json", {"stage": "clean", "files": {}, "folders": []}),  # nor a folder
    ],
    ids=["writer-clean", "writer-train", "marker-without-files", "marker-without-folder"],
)
def test_a_hand_made_claim_hands_no_folder_over(tiny_raw, tmp_path, claim):
    """A claim trusted by its content alone handed a user's folder over (the probe: clean,
    benchmark and train deleted or overwrote the user's files): a claim without a file list,
    or not written for this folder, claims nothing."""
    from grail.core.errors import GrailError

    mine = tmp_path / "mine"
    (mine / "data").mkdir(parents=True)
    (mine / "NOTES.txt").write_text("mine\n")
    (mine / "data" / "x.csv").write_text("a,b\n1,2\n")
    name, record = claim
    (mine / name).write_text(json.dumps(record))
    with pytest.raises(GrailError, match="holds files that no grail stage wrote here"):
        clean(tiny_raw, mine)
    with pytest.raises(GrailError, match="holds files that no grail stage wrote here"):
        check_owned(mine, "train")  # train writes in place: its claim must name the folder
    assert (mine / "NOTES.txt").read_text() == "mine\n"
    assert (mine / "data" / "x.csv").read_text() == "a,b\n1,2\n"


def test_train_s_claim_lists_what_it_wrote_and_refuses_anything_else(tmp_path):
    """Training writes in place, so its claim (``_WRITER.json``) is rewritten as it goes: it
    names each top-level folder before writing it (``writing``: a checkpoint, the warm start)
    and lists its files once written (size and modification time). A resume accepts only what
    is listed, unchanged, and what is inside a folder it was writing when it stopped. A file
    put in, an edit, a file inside a listed folder, a folder named like a checkpoint it never
    began (the probe's `checkpoint-0/notes.txt`, deleted by rotation; a `sft/` file
    overwritten by a resumed warm start), a bare-size entry: refused in one line naming it.
    A claim naming the folder but listing nothing claims nothing."""
    import os

    from grail.core.errors import GrailError
    from grail.core.outputs import (
        CLAIM,
        MARKER,
        begin_write,
        claim_folder,
        end_write,
        mark_complete,
        strays,
    )

    out = tmp_path / "run"
    claim_folder(out, "train")
    assert json.loads((out / CLAIM).read_text())["files"] == {}
    begin_write(out, "train", ["sft"])
    (out / "sft").mkdir()
    (out / "sft" / "model.safetensors").write_bytes(b"w" * 10)
    check_owned(out, "train")  # killed while cloning: its own unfinished write
    end_write(out, "train", ["sft"])
    begin_write(out, "train", ["checkpoint-1", "README.md"])
    (out / "checkpoint-1").mkdir()
    (out / "checkpoint-1" / "optimizer.pt").write_bytes(b"o" * 10)
    (out / "README.md").write_text("model card, step 1\n")  # TRL's, beside the checkpoint
    end_write(out, "train", ["checkpoint-1", "README.md"])
    listed = json.loads((out / CLAIM).read_text())
    names = {"sft/model.safetensors", "checkpoint-1/optimizer.pt", "README.md"}
    assert set(listed["files"]) == names
    assert listed["folders"] == ["checkpoint-1", "sft"] and listed["writing"] == []
    assert listed["folder"] == str(out)
    check_owned(out, "train")
    begin_write(out, "train", ["checkpoint-2", "README.md"])
    (out / "README.md").write_text("model card, step 2: longer\n")
    (out / "checkpoint-2").mkdir()  # killed while saving step 2
    (out / "checkpoint-2" / "optimizer.pt").write_bytes(b"half")
    check_owned(out, "train")
    put = {
        "NOTES.txt": "was not written by `grail train`",
        "sft/extra.txt": "was not written by `grail train`",
        "checkpoint-0/notes.txt": "was not written by `grail train`",  # named: checkpoint-0
        "checkpoint-1/optimizer.pt": "was changed since it was written by `grail train`",
    }
    for name, why in put.items():
        path = out / name
        made = not path.parent.exists()
        path.parent.mkdir(exist_ok=True)
        before = path.read_bytes() if path.exists() else None
        stat = path.stat() if path.exists() else None
        path.write_bytes(b"x" * 10)
        if stat is not None:  # same size, a later time: an edit
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        named = "checkpoint-0" if name.startswith("checkpoint-0") else name
        with pytest.raises(GrailError, match=f"{named} {why}; it is not replaced"):
            check_owned(out, "train")
        if before is not None:
            path.write_bytes(before)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        else:
            path.unlink()
        if made:
            path.parent.rmdir()
    check_owned(out, "train")
    assert strays(out, "train") == []
    (out / "sft" / "NOTES.txt").write_text("mine")  # put there while training runs
    (out / "mine" / "deep").mkdir(parents=True)
    (out / "mine" / "deep" / "data.csv").write_text("1,2")
    assert strays(out, "train") == ["mine", "sft/NOTES.txt"]
    mark_complete(out, "train", leave_out=strays(out, "train"))
    marked = json.loads((out / MARKER).read_text())
    assert "sft/model.safetensors" in marked["files"] and "sft" in marked["folders"]
    assert not [n for n in [*marked["files"], *marked["folders"]] if "mine" in n or "NOTES" in n]
    (out / MARKER).unlink()
    shutil.rmtree(out / "mine")
    (out / "sft" / "NOTES.txt").unlink()
    claim = json.loads((out / CLAIM).read_text())
    claim["files"]["checkpoint-1/optimizer.pt"] = 10  # a bare size records no file
    (out / CLAIM).write_text(json.dumps(claim))
    with pytest.raises(GrailError, match="checkpoint-1/optimizer.pt was changed since"):
        check_owned(out, "train")
    (out / CLAIM).write_text(json.dumps({"command": "train", "folder": str(out)}))
    with pytest.raises(GrailError, match=f"its {CLAIM} lists no files .* claims nothing"):
        check_owned(out, "train")


def test_a_claim_copied_from_another_folder_claims_nothing(tiny_raw, tmp_path):
    """A finished output's marker names the folder it was written for: copied (with the
    output, or alone beside someone's files) it hands the copy over to no command."""
    from grail.core.errors import GrailError

    out = tmp_path / "data"
    clean(tiny_raw, out)
    clean(tiny_raw, out)  # its own folder: replaced
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    with pytest.raises(GrailError, match="was not written for it"):
        clean(tiny_raw, copy)
    assert check_complete(copy)["stage"] == "clean"  # still a readable output where it is


def test_files_put_inside_an_output_s_folders_are_never_deleted(tmp_path):
    """The marker lists the files inside its folders too (simulate's surveys/ and trees/ were
    listed by name alone, and a rerun deleted what a user put there); a file of it changed
    inside a folder is named by its path."""
    from grail.core.errors import GrailError
    from grail.tasks.slate.simulate import simulate

    out = tmp_path / "raw"
    simulate(out, participants=30)
    marker = json.loads((out / "_COMPLETE.json").read_text())
    assert marker["folder"] == str(out.resolve())
    assert any(name.startswith("trees/") for name in marker["files"])
    (out / "surveys" / "my_notes.csv").write_text("mine\n")
    with pytest.raises(GrailError, match="surveys/my_notes.csv was not written by"):
        simulate(out, participants=30)
    assert (out / "surveys" / "my_notes.csv").read_text() == "mine\n"
    (out / "surveys" / "my_notes.csv").unlink()
    tree = next(name for name in marker["files"] if name.startswith("trees/"))
    (out / tree).write_text("edited\n")
    with pytest.raises(GrailError, match=f"{tree} was changed since it was written by"):
        simulate(out, participants=30)
    assert (out / tree).read_text() == "edited\n"


def test_a_user_s_backup_beside_an_output_is_not_a_leftover(tiny_raw, tmp_path):
    """`mv out .out.old` (a user's backup) was deleted by the next run as grail's leftover;
    grail's own leftovers hold a marker naming them, and only those go."""
    from grail.core.outputs import mark_leftover

    out = tmp_path / "data"
    clean(tiny_raw, out)
    backups = [
        tmp_path / ".data.old",
        tmp_path / ".data.old-1a2b3c4d",
        tmp_path / ".data.writing-1-x",
    ]
    for backup in backups:
        backup.mkdir()
        (backup / "kept.txt").write_text("mine\n")
    copied = tmp_path / ".data.old-copied"  # grail's marker, copied from another leftover
    copied.mkdir()
    mark_leftover(tmp_path / ".data.old-copied")
    (copied / "_LEFTOVER.json").write_text(
        (copied / "_LEFTOVER.json").read_text().replace("copied", "elsewhere")
    )
    ours = tmp_path / ".data.old-5e6f7a8b"
    ours.mkdir()
    mark_leftover(ours)
    clean(tiny_raw, out)
    assert all((backup / "kept.txt").read_text() == "mine\n" for backup in backups)
    assert copied.is_dir() and not ours.exists()


def _one_line(argv: list[str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "grail.cli", *argv], capture_output=True, text=True, timeout=300
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[-1].startswith("grail: error: "), lines
    return lines[-1]


def test_a_deeply_nested_marker_or_run_record_is_one_line(tmp_path):
    """The probe: a hand-made `_COMPLETE.json` or `_RUN.json` nested deeper than Python's JSON
    parser goes was a RecursionError traceback."""
    from grail.cli import _guarded
    from grail.core.checkpoints import RUN_RECORD, run_record
    from grail.core.storage import Location

    nested = "[" * 100_000 + "]" * 100_000
    out = tmp_path / "raw"
    out.mkdir()
    (out / "_COMPLETE.json").write_text(nested)
    line = _one_line(["simulate", "--out", str(out), "--participants", "10"])
    assert "nested deeper than grail reads" in line
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / RUN_RECORD).write_text(nested)
    assert _guarded(lambda: run_record(Location.parse(f"file://{tmp_path}/ckpt")), False) == 2


def test_an_out_the_process_may_not_write_is_one_line(tmp_path):
    """The probe: an `--out` the process cannot write was a PermissionError traceback."""
    import os

    target = Path("/sys/grail-test-out")
    try:
        os.mkdir(target)
    except PermissionError:
        pass
    except OSError as error:
        pytest.skip(f"/sys refuses a folder with {error.strerror}, not a permission error")
    else:  # pragma: no cover (a machine whose /sys takes folders)
        os.rmdir(target)
        pytest.skip("/sys takes a new folder here: no path the process may not write")
    line = _one_line(["simulate", "--out", str(target / "raw"), "--participants", "10"])
    assert "/sys/grail-test-out" in line and "not permitted" in line


def test_a_truncated_gguf_is_one_line(tmp_path, error_line):
    """The probe: `grail import-gguf` of a truncated .gguf was a struct.error traceback; and
    a user's folder as its --out is refused before the file is read."""
    truncated = tmp_path / "model.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00\x10\x00")
    line = error_line(["import-gguf", "--gguf", str(truncated), "--out", str(tmp_path / "m")])
    assert "not a GGUF file transformers can read, truncated or damaged" in line
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    line = _one_line(["import-gguf", "--gguf", str(truncated), "--out", str(mine)])
    assert "holds files that no grail stage wrote here" in line
    assert (mine / "notes.txt").read_text() == "mine\n"


def test_train_s_marker_records_checkpoints_by_size_and_mtime_and_still_sees_an_edit(tmp_path):
    """Hashing every checkpoint's optimizer state at the end of training would take minutes:
    the resume state below checkpoint-N/ is recorded by size and modification time (the rest,
    a checkpoint's model files included, by sha256), and an edit to one is still a change."""
    import os

    from grail.core.outputs import is_recorded, mark_complete

    out = tmp_path / "run"
    (out / "checkpoint-2").mkdir(parents=True)
    (out / "sft" / "checkpoint-1").mkdir(parents=True)
    for name in ("model.safetensors", "checkpoint-2/optimizer.pt", "sft/checkpoint-1/x.bin"):
        (out / name).write_bytes(b"w" * 64)
    mark_complete(out, "train", unhashed="checkpoint-")
    files = json.loads((out / "_COMPLETE.json").read_text())["files"]
    assert "sha256" in files["model.safetensors"]
    assert set(files["checkpoint-2/optimizer.pt"]) == {"size", "mtime_ns"}
    assert set(files["sft/checkpoint-1/x.bin"]) == {"size", "sha256"}  # a model file: hashed
    assert is_recorded(out / "checkpoint-2/optimizer.pt", files["checkpoint-2/optimizer.pt"])
    (out / "checkpoint-2/optimizer.pt").write_bytes(b"v" * 64)  # same size, new bytes
    later = files["checkpoint-2/optimizer.pt"]["mtime_ns"] + 10**9
    os.utime(out / "checkpoint-2/optimizer.pt", ns=(later, later))
    assert not is_recorded(out / "checkpoint-2/optimizer.pt", files["checkpoint-2/optimizer.pt"])


def test_what_arrives_at_the_output_during_a_run_is_checked_again_before_the_swap(
    tiny_raw, tmp_path
):
    """The hostile probe: ownership was checked when a run started only, so a file a user put
    into the output (or a folder created at --out) while a rerun was in flight was deleted
    with the old output. The swap checks again, under the lock."""
    from grail.core.errors import GrailError
    from grail.core.outputs import atomic_folder

    out = tmp_path / "data"
    clean(tiny_raw, out)
    refused = pytest.raises(GrailError, match="notes.md was not written by")
    with refused, atomic_folder(out, "clean") as staging:
        (staging / "x.txt").write_text("new\n")
        (out / "notes.md").write_text("mine\n")  # while the run writes
    assert (out / "notes.md").read_text() == "mine\n"
    fresh = tmp_path / "fresh"
    refused = pytest.raises(GrailError, match="holds files that no grail stage wrote here")
    with refused, atomic_folder(fresh, "clean") as staging:
        (staging / "x.txt").write_text("new\n")
        fresh.mkdir()
        (fresh / "thesis.txt").write_text("mine\n")
    assert (fresh / "thesis.txt").read_text() == "mine\n"
    assert not [p for p in tmp_path.iterdir() if ".writing-" in p.name]


@pytest.mark.parametrize(
    "entry", [9, {"size": 9, "mtime_ns": 0}], ids=["bare-size", "size-and-time"]
)
def test_a_forged_marker_needs_the_bytes_hash(tiny_raw, tmp_path, entry):
    """The hostile probe forged `_COMPLETE.json` with the folder's path and the user's file by
    size (or size and modification time): no hashing needed, and the file was deleted. A
    claim hands a file over only when it records the file's sha256."""
    from grail.core.errors import GrailError

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("precious\n")
    if isinstance(entry, dict):
        entry = {"size": 9, "mtime_ns": (mine / "thesis.txt").stat().st_mtime_ns}
    record = {"stage": "clean", "folder": str(mine.resolve()), "files": {"thesis.txt": entry}}
    (mine / "_COMPLETE.json").write_text(json.dumps(record))
    with pytest.raises(GrailError, match="thesis.txt was not written by"):
        clean(tiny_raw, mine)
    assert (mine / "thesis.txt").read_text() == "precious\n"


def test_the_current_folder_a_link_in_train_s_folder_and_malformed_markers_are_one_line(
    tmp_path, monkeypatch
):
    """The hostile probe: `--out .` was an OSError (EBUSY) traceback; a folder train claimed
    skipped the check for links; a marker whose files are a list, or not UTF-8, was an
    AttributeError or UnicodeDecodeError traceback where a reader checked it."""
    from grail.core.errors import DataError, GrailError
    from grail.core.outputs import check_complete, claim_folder

    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    line = _one_line(["simulate", "--out", ".", "--participants", "10"])
    assert "is the current folder, or holds it" in line
    claimed = tmp_path / "run"
    claim_folder(claimed, "train")
    (claimed / "summary.json").symlink_to(tmp_path / "victim.json")
    with pytest.raises(GrailError, match="summary.json is a symbolic link"):
        check_owned(claimed, "train")
    for content in (b'{"stage": "clean", "files": []}', b"\xff"):
        (tmp_path / "bad").mkdir(exist_ok=True)
        (tmp_path / "bad" / "_COMPLETE.json").write_bytes(content)
        with pytest.raises(DataError, match="unreadable _COMPLETE.json"):
            check_complete(tmp_path / "bad")


def test_an_out_name_is_not_a_glob_pattern_for_leftovers(tiny_raw, tmp_path):
    """`--out 'x?'` deleted `.xy.old-*`, grail's leftover of another output."""
    from grail.core.outputs import mark_leftover

    other = tmp_path / ".xy.old-1234abcd"
    other.mkdir()
    mark_leftover(other)
    clean(tiny_raw, tmp_path / "x?")
    assert other.is_dir()


def test_compile_never_empties_a_file_it_did_not_compile(tmp_path):
    """The probe: `grail compile --out notes.json` (a user's file) was a traceback and left
    it empty (kfp opens the file for writing before it fails); a .yaml was overwritten, a
    link followed. Now: refused in one line before kfp writes, the file whole; a DAG it
    compiled is replaced."""
    from grail.core.errors import GrailError
    from grail.launch.compile import compile_pipeline

    notes, plain = tmp_path / "notes.json", tmp_path / "mine.yaml"
    notes.write_text('{"mine": 1}')
    plain.write_text("mine: 1\n")
    (tmp_path / "link.yaml").symlink_to(plain)
    for path, why in ((notes, "did not write it"), (plain, "did not write it"),
                      (tmp_path / "link.yaml", "is a link")):  # fmt: skip
        with pytest.raises(GrailError, match=why):
            compile_pipeline(path, "summarize")
    assert notes.read_text() == '{"mine": 1}' and plain.read_text() == "mine: 1\n"
    out = compile_pipeline(tmp_path / "dag.yaml", "summarize")
    again = compile_pipeline(out, "summarize")  # its own: replaced
    assert again.read_text().startswith("# PIPELINE DEFINITION")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dag.yaml",
        "link.yaml",
        "mine.yaml",
        "notes.json",
    ]


def test_the_second_probe_s_tracebacks_are_one_line(tmp_path, tiny_raw, error_line):
    """The hostile re-probe: a JSON integer of over 4,300 digits in a marker, a 300-character
    --out, a loop of links, and a resume_from_checkpoint that does not exist were tracebacks;
    a train --output_dir that is a link was written through."""
    huge = tmp_path / "huge"
    huge.mkdir()
    (huge / "_COMPLETE.json").write_text('{"files": {"a": ' + "9" * 5000 + "}}")
    (huge / "a").write_text("x")
    assert "unreadable" in _one_line(["clean", "--raw", str(tiny_raw), "--out", str(huge)])
    long = tmp_path / ("x" * 300)
    assert "File name too long" in _one_line(["simulate", "--out", str(long)])
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    line = _one_line(["simulate", "--out", str(tmp_path / "loop" / "out")])
    assert "loop" in line or "symbolic links" in line, line
    empty, model, data = tmp_path / "empty", tmp_path / "model", tmp_path / "data"
    for folder in (empty, model, data):
        folder.mkdir()
    (tmp_path / "link").symlink_to(empty)
    train = ["train", "--config", "recipes/tiny/config_grpo.yaml", "--model_name_or_path",
             str(model), "--dataset", str(data), "--output_dir"]  # fmt: skip
    line = error_line([*train, str(tmp_path / "link")])
    assert "is a symbolic link" in line and list(empty.iterdir()) == []
    line = error_line([*train, str(tmp_path / "run"), "--resume_from_checkpoint", "/nonexistent"])
    assert "/nonexistent is not a checkpoint" in line


def test_an_output_keeps_the_access_given_to_its_folder(tmp_path):
    """The probe: an empty folder a user made for an output (mode 2770: a shared group's)
    was replaced by the staged output with the default mode and no setgid bit; an output
    made inside a setgid folder lost the bit that the folder hands down."""
    import stat

    from grail.core.outputs import atomic_folder

    made = tmp_path / "made"
    made.mkdir()
    made.chmod(0o2770)
    with atomic_folder(made, "clean") as staging:
        (staging / "x.txt").write_text("x")
    assert stat.S_IMODE(made.stat().st_mode) == 0o2770
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2775)
    with atomic_folder(shared / "out", "clean") as staging:
        (staging / "x.txt").write_text("x")
    assert (shared / "out").stat().st_mode & stat.S_ISGID


def test_a_marker_never_walks_into_what_it_leaves_out(tmp_path, monkeypatch):
    """Training's marker leaves out the checkpoint uploader's snapshots, which its thread may be
    removing meanwhile (a CI run failed when the walk scanned a folder just deleted): a folder
    left out is never scanned, at any depth, and everything else is listed."""
    import os

    from grail.core import outputs

    for name in (".upload-staging/checkpoint-3/model.bin", "checkpoint-3/model.bin", "a/b/c"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    scandir = os.scandir

    def gone_meanwhile(path="."):  # as if the uploader had just removed its snapshot
        if ".upload-staging/" in f"{Path(path).as_posix()}/":
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", gone_meanwhile)
    files, folders = outputs.written_files(tmp_path, leave_out=[".upload-staging", "a/b"])
    assert sorted(files) == ["checkpoint-3/model.bin"]
    assert folders == ["a", "checkpoint-3"]


def test_files_written_in_place_are_replaced_not_written_through(tmp_path):
    """Training writes its output folder in place (its marker, summary, metrics, the GAIL
    state; here the marker and the metrics): each file is a new one renamed over the old, so
    a hard-linked backup of the folder (``cp -al``) keeps what it held."""
    import os

    from grail.core.outputs import mark_complete
    from grail.train.logs import MetricsCallback

    run, backup = tmp_path / "run", tmp_path / "backup"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    mark_complete(run, "train")
    callback = MetricsCallback()
    callback.write(run)
    backup.mkdir()
    for path in run.iterdir():
        os.link(path, backup / path.name)
    before = {p.name: p.read_bytes() for p in backup.iterdir()}
    (run / "new.json").write_text("{}")  # the marker changes: it lists one more file
    callback.rows.append({"step": 2, "loss": 1.0})
    callback.write(run)
    mark_complete(run, "train")
    assert {p.name: p.read_bytes() for p in backup.iterdir()} == before
    assert json.loads((run / "metrics.json").read_text()) == [{"step": 2, "loss": 1.0}]
    assert sorted(p.name for p in run.iterdir()) == sorted([*before, "new.json"])  # none staged


def test_a_killed_commands_scratch_folder_is_removed_by_the_next(tmp_path, monkeypatch):
    """SIGKILL left empty ``grail-export-*`` and ``grail-benchmark-*`` folders in the system's
    temporary folder for good: each scratch folder names its writer's pid, and the next grail
    command of that kind removes those whose writer no longer runs (a live one's, and a
    folder of the same name without grail's marker, stay)."""
    import tempfile

    from holders import holding

    from grail.core.outputs import work_folder

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    take = "from grail.core.outputs import work_folder\nwith work_folder('export') as w:"
    killed, live = holding(take), holding(take)
    killed.kill()
    killed.wait()
    (tmp_path / "grail-export-someone-else").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    assert len(before) == 3
    try:
        with work_folder("export") as mine:
            names = sorted(p.name for p in tmp_path.iterdir())
            assert f"grail-export-{killed.pid}-" not in " ".join(names)
            assert any(n.startswith(f"grail-export-{live.pid}-") for n in names)
            assert "grail-export-someone-else" in names and mine.name in names
        assert not mine.exists()
    finally:
        live.kill()
        live.wait()


def test_a_file_of_a_finished_output_read_on_its_own_is_checked(
    default_clean, tmp_path, error_line
):
    """``--data clean/validation.parquet`` read the file as it was: cut to 3 of its 21 rows,
    it was scored with rc 0 (probe B4). A file its folder's marker lists is checked against
    that entry; a file no marker lists is read as it is."""
    import pyarrow.parquet as pq

    copy = Path(shutil.copytree(default_clean, tmp_path / "clean"))
    table = pq.read_table(copy / "validation.parquet")
    pq.write_table(table.slice(0, 3), copy / "validation.parquet")
    for argv in (["prompt", str(copy / "validation.parquet")],
                 ["benchmark", "--data", str(copy / "validation.parquet"), "--out",
                  str(tmp_path / "b")]):  # fmt: skip
        line = error_line(argv)
        assert "validation.parquet is not the file clean wrote" in line, line
    alone = tmp_path / "alone.parquet"
    shutil.copyfile(copy / "validation.parquet", alone)
    from grail.tasks.slate.contract import read_dataset

    assert read_dataset(alone).num_rows == 3
