"""Checkpoints: every save uploaded (moto S3 on 127.0.0.1), half uploads never chosen, a killed
training process resumes at the right step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from tiny_settings import tiny_args

from grail.core.checkpoints import MARKER, complete_checkpoints, resolve_latest, resume_path
from grail.core.errors import GrailError
from grail.core.storage import Location, list_files, upload_folder
from grail.train.config import parse_train_args
from grail.train.stage import run

_args = tiny_args


def test_every_checkpoint_is_uploaded_to_s3(s3, tmp_path, tiny_policy, small_clean):
    uri = f"s3://{s3}/runs/a"
    run(
        *parse_train_args(
            _args(
                small_clean,
                tiny_policy,
                tmp_path / "out",
                "--max_steps",
                4,
                "--save_steps",
                1,
                "--save_total_limit",
                1,
                "--checkpoint_uri",
                uri,
            )
        )
    )
    assert sorted(complete_checkpoints(uri)) == [1, 2, 3, 4]
    keys = list_files(Location.parse(uri))
    assert "checkpoint-4/model.safetensors" in keys and "checkpoint-4/trainer_state.json" in keys
    assert "checkpoint-2/metrics.json" in keys
    # save_total_limit rotated the local copies, the object store kept them all.
    assert [p.name for p in (tmp_path / "out").glob("checkpoint-*")] == ["checkpoint-4"]


def _fake_checkpoint(folder: Path, step: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * (step + 10))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def test_a_half_uploaded_checkpoint_is_never_chosen(tmp_path, s3):
    for uri in (f"file://{tmp_path / 'store'}", f"s3://{s3}/ckpt"):
        location = Location.parse(uri)
        for step in (2, 3, 4):
            names = upload_folder(
                _fake_checkpoint(tmp_path / uri[:2] / f"checkpoint-{step}", step),
                location.child(f"checkpoint-{step}"),
            )
            sizes = {
                n: (tmp_path / uri[:2] / f"checkpoint-{step}" / n).stat().st_size for n in names
            }
            if step == 4:  # marker claims a file that never arrived
                sizes["optimizer.pt"] = 123
            if step != 3:  # checkpoint-3: the upload died before its marker
                from grail.core.storage import write_text

                write_text(
                    location.child(f"checkpoint-{step}/{MARKER}"),
                    json.dumps({"global_step": step, "files": sizes}),
                )
        assert resolve_latest(uri) == "checkpoint-2", uri
        local = resume_path("latest", uri, str(tmp_path / f"out-{uri[:2]}"))
        assert Path(local).name == "checkpoint-2"
        assert json.loads((Path(local) / "trainer_state.json").read_text())["global_step"] == 2


def test_a_checkpoint_corrupted_after_its_marker_is_named_and_skipped(tmp_path, s3, caplog):
    """A same-size file replaced in a completed checkpoint: sizes still match, the sha256 in
    the marker does not. Before, every resume stopped there, blaming "another run"; now the
    checkpoint is named in one line and the one before it resumed, nothing half-downloaded."""
    from grail.core.checkpoints import upload_complete
    from grail.core.storage import write_text

    for uri in (f"file://{tmp_path / 'store'}", f"s3://{s3}/shared"):
        for step in (2, 4):
            location = Location.parse(uri).child(f"checkpoint-{step}")
            folder = _fake_checkpoint(tmp_path / uri[:2] / f"checkpoint-{step}", step)
            upload_complete(folder, location, step)
        assert resolve_latest(uri) == "checkpoint-4"
        write_text(location.child("model.safetensors"), "y" * 14)  # same size, other bytes
        out = tmp_path / f"out-{uri[:2]}"
        caplog.clear()
        assert Path(resume_path("latest", uri, str(out))).name == "checkpoint-2"
        assert "checkpoint-4: skipped, " in caplog.text
        assert "model.safetensors is not the file its marker records" in caplog.text
        assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2"]


def test_a_truncated_checkpoint_is_named_when_skipped(tmp_path, caplog):
    from grail.core.checkpoints import upload_complete
    from grail.core.storage import write_text

    uri = f"file://{tmp_path / 'store'}"
    for step in (2, 4):
        location = Location.parse(uri).child(f"checkpoint-{step}")
        upload_complete(_fake_checkpoint(tmp_path / f"checkpoint-{step}", step), location, step)
    write_text(location.child("model.safetensors"), "y" * 3)  # cut short
    assert resolve_latest(uri) == "checkpoint-2"
    assert "checkpoint-4: skipped, incomplete or truncated" in caplog.text


def test_a_fresh_run_never_writes_over_another_runs_checkpoints(tmp_path, s3):
    """Before, the lease only queued runs: a fresh run on a used checkpoint_uri rewrote
    checkpoint-N over the other run's, and `latest` could resume the wrong one."""
    from grail.core.checkpoints import (
        RUN,
        RUN_RECORD,
        CheckpointsOfAnotherRun,
        claim_checkpoints,
        upload_complete,
    )
    from grail.core.storage import read_text

    for uri in (f"file://{tmp_path / 'store'}", f"s3://{s3}/owned"):
        first = claim_checkpoints(uri, resuming=False)
        assert json.loads(read_text(Location.parse(uri).child(RUN_RECORD)))["run"] == first
        upload_complete(
            _fake_checkpoint(tmp_path / uri[:2] / "checkpoint-2", 2),
            Location.parse(uri).child("checkpoint-2"),
            2,
        )
        with pytest.raises(CheckpointsOfAnotherRun, match=f"belongs to run {first}"):
            claim_checkpoints(uri, resuming=False)  # a second fresh run
        assert claim_checkpoints(uri, resuming=True) == first  # its retry continues it
        # a checkpoint another run wrote there is never resumed
        os.environ[RUN] = "someone-else"
        try:
            upload_complete(
                _fake_checkpoint(tmp_path / uri[:2] / "checkpoint-6", 6),
                Location.parse(uri).child("checkpoint-6"),
                6,
            )
        finally:
            os.environ.pop(RUN)
        assert resolve_latest(uri) == "checkpoint-2"
        assert sorted(complete_checkpoints(uri)) == [2, 6]


def test_a_fresh_run_on_checkpoints_without_a_record_is_refused(tmp_path):
    from grail.core.checkpoints import CheckpointsOfAnotherRun, claim_checkpoints, upload_complete

    uri = f"file://{tmp_path / 'store'}"
    upload_complete(
        _fake_checkpoint(tmp_path / "checkpoint-2", 2), Location.parse(uri).child("checkpoint-2"), 2
    )
    with pytest.raises(
        CheckpointsOfAnotherRun, match=r"holds checkpoints of an earlier run \(steps 2\)"
    ):
        claim_checkpoints(uri, resuming=False)


def test_a_second_fresh_grail_train_on_a_used_uri_is_one_line(
    tmp_path, tiny_policy, small_clean, capsys
):
    from grail.cli import main
    from grail.core.checkpoints import claim_checkpoints

    uri = f"file://{tmp_path / 'store'}"
    claim_checkpoints(uri, resuming=False)  # the first run's
    argv = _args(small_clean, tiny_policy, tmp_path / "out", "--checkpoint_uri", uri)
    assert main(["train", *argv]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "belongs to run" in last and "resume_from_checkpoint: latest" in last, last
    assert not (tmp_path / "out").exists()


def test_a_training_beside_another_in_its_output_dir_is_one_line(
    tmp_path, tiny_policy, small_clean, capsys
):
    """Two trainings started together on one output_dir interleaved their checkpoints (one
    run's steps 1-2, the other's step 3 and final model, one valid marker): while a process
    writes the folder, a second `grail train` there is refused at once, in one line, with
    nothing written; once that process is gone (killed: its hold goes with it), the folder is
    free again."""
    from holders import holding

    from grail.cli import main
    from grail.core.outputs import one_writer

    out = tmp_path / "cc"
    holder = holding(
        f"from grail.core.outputs import one_writer\nwith one_writer({str(out)!r}, 'training'):"
    )
    try:
        (out / "marker-of-the-first.txt").write_text("its")
        before = sorted(p.name for p in out.iterdir())
        assert main(["train", *_args(small_clean, tiny_policy, out, "--seed", "2")]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert "another training is writing this folder now" in line, line
        assert sorted(p.name for p in out.iterdir()) == before
    finally:
        holder.kill()
        holder.wait()
    with one_writer(out, "training"):
        pass


def test_a_run_refused_after_claiming_its_new_output_dir_leaves_no_folder(
    tmp_path, tiny_policy, small_clean, capsys
):
    """A late refusal (here: a resume path that is no checkpoint, found after output_dir was
    claimed) left a new output_dir holding only _WRITER.json: the folder goes again."""
    from grail.cli import main

    out = tmp_path / "new"
    argv = _args(small_clean, tiny_policy, out, "--resume_from_checkpoint", str(tmp_path / "x"))
    assert main(["train", *argv]) == 2
    assert "is not a checkpoint" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("place", ["out", "out/ckpt", "data/ckpt", "file://{tmp}/model"])
def test_a_checkpoint_uri_in_the_output_dir_or_what_training_reads_is_one_line(
    tmp_path, capsys, place
):
    """checkpoint_uri equal to output_dir left the run's own lease and record blocking the
    folder for good; one inside the dataset or the start model would have its uploads written
    among what training reads: refused before anything is taken or made."""
    from grail.cli import main

    for folder in ("data", "model"):
        (tmp_path / folder).mkdir()
    uri = place.format(tmp=tmp_path) if "://" in place else str(tmp_path / place)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    argv = ["--dataset", str(tmp_path / "data"), "--model_name_or_path", str(tmp_path / "model"),
            "--output_dir", str(tmp_path / "out"), "--checkpoint_uri", uri]  # fmt: skip
    recipe = Path(__file__).resolve().parents[1] / "recipes/tiny/config_grpo.yaml"
    assert main(["train", "--config", str(recipe), *argv]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"checkpoint_uri {uri} " in line and "a place of their own" in line, line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_resume_after_a_save_cut_short_goes_on_from_the_last_whole_checkpoint(tmp_path, caplog):
    """Killed (or out of disk) mid-save, a run left checkpoint-2 without trainer_state.json,
    and its resume failed on it until the folder was deleted by hand: ``latest`` passes over
    a save that did not finish, says so, and resumes from the newest whole one."""
    import logging

    out = tmp_path / "out"
    _fake_checkpoint(out / "checkpoint-1", 1)
    (out / "checkpoint-2").mkdir()
    (out / "checkpoint-2" / "model.safetensors").write_bytes(b"half")
    (out / "checkpoint-²").mkdir()  # not a step (str.isdigit takes it; int() does not)
    with caplog.at_level(logging.WARNING):
        assert resume_path("latest", None, str(out)) == str(out / "checkpoint-1")
    assert "checkpoint-2: its save did not finish" in caplog.text
    assert (out / "checkpoint-2" / "model.safetensors").read_bytes() == b"half"


def test_a_resume_from_another_runs_checkpoint_is_refused(tmp_path):
    """``--resume_from_checkpoint <another run>/checkpoint-1`` into a finished run left it
    holding its own step 1 and the other run's continuation as step 2: a resume continues
    its own output_dir's checkpoints; another run's start is fork_from's."""
    from grail.core.errors import GrailError

    other = _fake_checkpoint(tmp_path / "other" / "checkpoint-1", 1)
    own = _fake_checkpoint(tmp_path / "o1" / "checkpoint-1", 1)
    assert resume_path(str(own), None, str(tmp_path / "o1")) == str(own)
    with pytest.raises(GrailError, match="is not a checkpoint of output_dir .*fork_from"):
        resume_path(str(other), None, str(tmp_path / "o1"))


def test_latest_without_any_checkpoint_starts_fresh(tmp_path):
    assert resume_path("latest", f"file://{tmp_path / 'empty'}", str(tmp_path / "out")) is None
    checkpoint = _fake_checkpoint(tmp_path / "checkpoint-3", 3)
    assert resume_path(str(checkpoint), None, str(tmp_path)) == str(checkpoint)  # as given
    from grail.core.errors import GrailError

    with pytest.raises(GrailError, match="some/path is not a checkpoint"):  # was a traceback
        resume_path("some/path", None, str(tmp_path))


def _wait_for_upload(uri: str, step: int, process: subprocess.Popen, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if step in complete_checkpoints(uri):
            return
        assert process.poll() is None, process.stdout.read()
        time.sleep(0.05)
    raise AssertionError(f"checkpoint-{step} was not uploaded in time")


TRAIN = [sys.executable, "-m", "grail.cli", "train"]


def unbuffered() -> dict:
    """This test's environment (the S3 fixture sets the endpoint) with unbuffered output."""
    return os.environ | {"PYTHONUNBUFFERED": "1"}


HOLD = Path(__file__).resolve().parent / "hold"


def kill_after_first_upload(argv: list[str], uri: str, hold_at: int) -> int:
    """Start `grail train`, SIGKILL it once step `hold_at`'s checkpoint is fully uploaded;
    returns that step. The run stops for good after that save (tests/hold), so the kill lands
    there whatever the machine's speed (and the run needs only a few steps past it to be killed
    far from its end)."""
    env = unbuffered()
    path = os.pathsep.join(filter(None, [str(HOLD), env.get("PYTHONPATH")]))
    env |= {"PYTHONPATH": path, "GRAIL_TEST_HOLD_AFTER_SAVE": str(hold_at)}
    first = subprocess.Popen(
        [*TRAIN, *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    _wait_for_upload(uri, hold_at, first)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL
    return hold_at


def resume_in_a_fresh_pod(argv: list[str], output_dir: Path) -> subprocess.CompletedProcess:
    """Nothing local survives, only the object store: train again from `latest`."""
    subprocess.run(["rm", "-rf", str(output_dir)], check=True)
    return subprocess.run(
        [*TRAIN, *argv, "--resume_from_checkpoint", "latest"],
        env=unbuffered(),
        text=True,
        capture_output=True,
        timeout=600,
    )


def test_a_killed_run_resumes_from_the_latest_upload_with_continuous_steps(
    s3, tmp_path, tiny_policy, small_clean
):
    uri = f"s3://{s3}/runs/killed"
    max_steps = 6  # held after step 2's save and killed there: far from the end
    common = _args(
        small_clean,
        tiny_policy,
        tmp_path / "out",
        "--max_steps",
        max_steps,
        "--save_steps",
        2,
        "--checkpoint_uri",
        uri,
    )
    uploaded = kill_after_first_upload(common, uri, hold_at=2)
    done = set(complete_checkpoints(uri))
    assert max(done) < max_steps, "the first run finished before it was killed"
    second = resume_in_a_fresh_pod(common, tmp_path / "out")
    assert second.returncode == 0, second.stdout + second.stderr
    # the checkpoint it downloaded is training's own: in its claim, so no stray, and a retry
    # takes the folder over (before: left out of the marker, and the retry refused)
    assert "appeared while training ran" not in second.stdout + second.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["global_step"] == max_steps
    resumed_at = int(Path(summary["resumed_from"]).name.split("-")[1])
    assert resumed_at >= uploaded and resumed_at in done
    rows = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert [r["step"] for r in rows] == list(range(1, max_steps + 1))
    bucket_keys = boto3.client("s3").list_objects_v2(Bucket=s3, Prefix="runs/killed/")
    assert any(
        k["Key"].endswith(f"checkpoint-{max_steps}/{MARKER}") for k in bucket_keys["Contents"]
    )


def test_training_reads_its_dataset_from_s3(s3, tmp_path, tiny_policy, small_clean):
    upload_folder(small_clean, Location.parse(f"s3://{s3}/data/clean"))
    argv = _args(f"s3://{s3}/data/clean", tiny_policy, tmp_path / "out", "--max_steps", 1)
    summary = run(*parse_train_args([*argv, "--save_strategy", "no"]))
    assert summary["global_step"] == 1
    assert summary["sft_model"]  # the behaviour cloning read the same S3 dataset


def test_resuming_a_finished_run_trains_zero_steps(s3, tmp_path, tiny_policy, small_clean):
    """A Kubeflow retry (or a deliberate resume) of a run that already finished must leave the
    model as it was: transformers on its own trains one step past max_steps."""
    uri = f"s3://{s3}/runs/finished"
    common = _args(small_clean, tiny_policy, tmp_path / "out", "--max_steps", 3, "--save_steps", 3)
    first = run(*parse_train_args([*common, "--checkpoint_uri", uri]))
    assert first["global_step"] == 3 and first["steps_trained"] == 3
    weights = (tmp_path / "out" / "model.safetensors").read_bytes()
    subprocess.run(["rm", "-rf", str(tmp_path / "out")], check=True)  # a fresh pod
    again = run(
        *parse_train_args([*common, "--checkpoint_uri", uri, "--resume_from_checkpoint", "latest"])
    )
    assert again["global_step"] == 3 and again["steps_trained"] == 0
    assert again["resumed_from"].endswith("checkpoint-3")
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == weights
    rows = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert max(complete_checkpoints(uri)) == 3


def test_a_local_resume_finds_every_file_training_wrote_in_its_claim(
    tmp_path, tiny_policy, small_clean, monkeypatch, caplog
):
    """Training's claim on its output_dir lists each checkpoint as it is saved (and the warm
    start, and TRL's model card): a resume in the same folder takes it over; a file put there
    since is named and refused before anything is written. One put there while it runs is
    named in a warning and left out of the finished run's marker (before: listed as the
    run's own, so a later rerun could replace it)."""
    from grail.core.errors import GrailError
    from grail.core.outputs import CLAIM, MARKER, check_owned
    from grail.train.stage import ClaimCheckpoints

    out = tmp_path / "out"
    common = _args(small_clean, tiny_policy, out, "--save_steps", 1)
    first = run(*parse_train_args([*common, "--max_steps", "2"]))
    assert first["global_step"] == 2
    assert "appeared while training ran" not in caplog.text  # all of it training's own
    assert "README.md" in json.loads((out / MARKER).read_text())["files"]
    listed = json.loads((out / CLAIM).read_text())
    assert {"checkpoint-1", "checkpoint-2", "sft"} <= set(listed["folders"])
    assert "checkpoint-2/trainer_state.json" in listed["files"]
    assert "sft/config.json" in listed["files"]
    (out / "NOTES.txt").write_text("mine\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    resume = [*common, "--max_steps", "3", "--resume_from_checkpoint", "latest"]
    with pytest.raises(GrailError, match="NOTES.txt was not written by `grail train`"):
        run(*parse_train_args(resume))
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    (out / "NOTES.txt").unlink()
    saved = ClaimCheckpoints.on_save

    def and_a_user_drops_a_file(self, args, state, control, **kwargs):
        saved(self, args, state, control, **kwargs)
        (out / "DROPPED.txt").write_text("put here while it ran\n")

    monkeypatch.setattr(ClaimCheckpoints, "on_save", and_a_user_drops_a_file)
    again = run(*parse_train_args(resume))
    assert again["global_step"] == 3 and again["resumed_from"].endswith("checkpoint-2")
    assert "checkpoint-3/trainer_state.json" in json.loads((out / CLAIM).read_text())["files"]
    assert "DROPPED.txt appeared while training ran" in caplog.text
    assert "DROPPED.txt" not in json.loads((out / MARKER).read_text())["files"]
    assert (out / "DROPPED.txt").read_text() == "put here while it ran\n"
    with pytest.raises(GrailError, match="DROPPED.txt was not written by `grail train`"):
        check_owned(out, "train")  # a later run does not take it for training's


def test_checkpoints_are_keyed_by_run_algorithm_and_issue():
    from grail.components.train.task import checkpoint_location

    a = checkpoint_location("s3://b/c", "run-a", "grail", "gun_control")
    b = checkpoint_location("s3://b/c", "run-b", "grail", "gun_control")
    c = checkpoint_location("s3://b/c", "run-a", "grpo", "gun_control")
    assert len({a, b, c}) == 3
    for bad in ("", "a/b", ".."):
        try:
            checkpoint_location("s3://b/c", bad, "grail", "gun_control")
        except Exception as error:  # GrailError: one line naming the key
            assert "checkpoint key" in str(error)
        else:
            raise AssertionError(f"key {bad!r} accepted")


def _upload(tmp_path: Path, uri: str, step: int, run: str, monkeypatch) -> None:
    from grail.core.checkpoints import RUN, upload_complete

    monkeypatch.setenv(RUN, run)
    folder = _fake_checkpoint(tmp_path / run / f"checkpoint-{step}", step)
    upload_complete(folder, Location.parse(uri).child(f"checkpoint-{step}"), step)


def test_a_resume_without_its_run_record_adopts_the_run_its_checkpoints_name(tmp_path, monkeypatch):
    """The probe followed grail's own advice (an unreadable `_RUN.json`: "delete it to let a
    run resume"): the resume then skipped both checkpoints as another run's, started fresh and
    overwrote checkpoint-1. It adopts the run the checkpoints' markers name now."""
    from grail.core.checkpoints import RUN, RUN_RECORD, claim_checkpoints
    from grail.core.errors import GrailError

    monkeypatch.delenv(RUN, raising=False)
    store = tmp_path / "store"
    uri = f"file://{store}"
    first = claim_checkpoints(uri, resuming=False)
    for step in (1, 2):
        _upload(tmp_path, uri, step, first, monkeypatch)
    (store / RUN_RECORD).write_text("{garbled")
    with pytest.raises(GrailError, match="delete it to let a run resume") as said:
        claim_checkpoints(uri, resuming=True)
    assert "unreadable" in str(said.value)
    (store / RUN_RECORD).unlink()  # the advice, followed
    assert claim_checkpoints(uri, resuming=True) == first
    assert json.loads((store / RUN_RECORD).read_text())["run"] == first
    assert resolve_latest(uri) == "checkpoint-2"


def test_a_resume_finding_only_another_run_s_checkpoints_is_refused(tmp_path, monkeypatch):
    """A `_RUN.json` copied from elsewhere beside a run's checkpoints: the resume found none of
    the recorded run's, started fresh and overwrote them. Refused in one line now; and
    checkpoints of two runs with no record are not guessed between."""
    from grail.core.checkpoints import (
        RUN,
        RUN_RECORD,
        CheckpointsOfAnotherRun,
        claim_checkpoints,
    )

    monkeypatch.delenv(RUN, raising=False)
    store = tmp_path / "store"
    uri = f"file://{store}"
    ours = claim_checkpoints(uri, resuming=False)
    _upload(tmp_path, uri, 1, ours, monkeypatch)
    (store / RUN_RECORD).write_text(json.dumps({"run": "copied", "started": "x"}))
    before = sorted(p.relative_to(store).as_posix() for p in store.rglob("*"))
    with pytest.raises(CheckpointsOfAnotherRun, match="no checkpoint there is that run's"):
        claim_checkpoints(uri, resuming=True)
    assert sorted(p.relative_to(store).as_posix() for p in store.rglob("*")) == before
    (store / RUN_RECORD).unlink()
    _upload(tmp_path, uri, 2, "another", monkeypatch)
    with pytest.raises(CheckpointsOfAnotherRun, match="come from 2 runs"):
        claim_checkpoints(uri, resuming=True)


@pytest.mark.parametrize("earlier", ["finished", "checkpoints"])
def test_a_fresh_train_into_an_earlier_run_s_output_dir_is_refused(tmp_path, capsys, earlier):
    """The probe: a second, fresh `grail train` into an earlier run's output_dir overwrote its
    README and checkpoint-1 and kept its checkpoint-2, and `grail benchmark --model` then
    scored both runs' checkpoints as one series. Refused in one line before anything loads;
    the advice (resume it) is what a resume takes."""
    from grail.cli import main
    from grail.core.outputs import claim_folder

    out = tmp_path / "out"
    claim_folder(out, "train")
    for step in (1, 2):
        _fake_checkpoint(out / f"checkpoint-{step}", step)
    if earlier == "finished":
        (out / "summary.json").write_text("{}")
    (out / "README.md").write_text("edited by hand\n")
    (out / "NOTES.txt").write_text("mine\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (tmp_path / "data").mkdir()
    (tmp_path / "model").mkdir()  # never read: the refusal comes first
    argv = _args(tmp_path / "data", tmp_path / "model", out)
    assert main(["train", *argv]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"output_dir {out}: holds a" in last and "--resume_from_checkpoint latest" in last
    assert "checkpoints of steps 1, 2" in last
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_the_benchmark_refuses_checkpoints_of_two_runs_as_one_series(tmp_path, monkeypatch):
    """The probe's mixed folder: `grail benchmark --model` scored two runs' checkpoints as one
    series. Checkpoints whose markers name two runs are refused before any download."""
    from grail.core.checkpoints import RUN
    from grail.core.errors import GrailError
    from grail.inference.specs import expand_spec

    monkeypatch.delenv(RUN, raising=False)
    uri = f"file://{tmp_path / 'store'}"
    _upload(tmp_path, uri, 1, "first", monkeypatch)
    _upload(tmp_path, uri, 2, "second", monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(GrailError, match=r"come from 2 runs \(first, second; steps 1 \(first\)"):
        expand_spec(uri, work)
    assert list(work.iterdir()) == []


def test_a_fresh_run_writes_only_to_an_empty_checkpoint_uri(tmp_path, monkeypatch):
    """The re-probe: a fresh run's checkpoint_uri had no ownership check; a user's
    checkpoint-1/config.json and final/README.md were overwritten, and a file:// URI was
    written through a link and inside an export. Refused in one line, nothing written."""
    from grail.core.checkpoints import RUN, claim_checkpoints
    from grail.core.errors import GrailError

    monkeypatch.delenv(RUN, raising=False)
    mine = tmp_path / "mine"
    (mine / "final").mkdir(parents=True)
    (mine / "final" / "README.md").write_text("mine\n")
    with pytest.raises(GrailError, match=r"holds files no run recorded \(final/README.md, 1 in"):
        claim_checkpoints(f"file://{mine}", resuming=False)
    assert sorted(p.name for p in mine.rglob("*")) == ["README.md", "final"]
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(GrailError, match="is a symbolic link"):
        claim_checkpoints(f"file://{tmp_path / 'link'}", resuming=False)
    export = tmp_path / "export"
    export.mkdir()
    (export / "manifest.json").write_text('{"files": {}}')
    with pytest.raises(GrailError, match="is inside an export"):
        claim_checkpoints(f"file://{export / 'ckpt'}", resuming=False)
    assert claim_checkpoints(f"file://{tmp_path / 'fresh'}", resuming=False)  # empty: its own


def test_a_fork_starts_from_another_runs_checkpoint_and_resumes_its_own(
    tmp_path, tiny_policy, small_clean
):
    """grail train --fork_from URI@checkpoint-N: a new run from step N of another run (its
    weights, optimizer and step count), writing only its own checkpoint_uri, whose _RUN.json
    names the parent; the parent's checkpoints are read, never written. A resume of the fork
    continues the fork's own latest checkpoint, not the parent's."""
    from grail.train.stage import train

    parent, fork = tmp_path / "parent-ckpt", tmp_path / "fork-ckpt"
    common = ["--save_steps", "1", "--save_total_limit", "1"]
    train(_args(small_clean, tiny_policy, tmp_path / "a", "--max_steps", 2, *common,
                "--checkpoint_uri", str(parent)))  # fmt: skip
    before = {p: p.stat().st_mtime_ns for p in parent.rglob("*") if p.is_file()}
    forked = _args(small_clean, tiny_policy, tmp_path / "b", *common, "--checkpoint_uri",
                   str(fork), "--fork_from", f"{parent}@checkpoint-1")  # fmt: skip
    first = train([*forked, "--max_steps", "2"])
    assert first["resumed_from"].endswith("checkpoint-1") and first["steps_trained"] == 1
    assert first["forked_from"] == f"{parent}@checkpoint-1" and first["global_step"] == 2
    state = json.loads((tmp_path / "b" / "checkpoint-2" / "trainer_state.json").read_text())
    assert [r["step"] for r in state["log_history"] if "loss" in r] == [1, 2]  # continuous
    assert json.loads((fork / "_RUN.json").read_text())["parent"] == f"{parent}@checkpoint-1"
    assert sorted(complete_checkpoints(str(fork))) == [2]  # its own steps only
    # a fresh pod resumes the fork: its own checkpoint-2, not the parent's checkpoint-1
    subprocess.run(["rm", "-rf", str(tmp_path / "b")], check=True)
    again = train([*forked, "--max_steps", "3", "--resume_from_checkpoint", "latest"])
    assert again["resumed_from"].endswith("checkpoint-2") and again["steps_trained"] == 1
    assert sorted(complete_checkpoints(str(fork))) == [2, 3]
    after = {p: p.stat().st_mtime_ns for p in parent.rglob("*") if p.is_file()}
    assert after == before  # the parent's checkpoints untouched
    with pytest.raises(GrailError, match="no complete checkpoint of step 5 \\(complete: 1, 2\\)"):
        train(_args(small_clean, tiny_policy, tmp_path / "c", "--max_steps", 6,
                    "--fork_from", f"{parent}@checkpoint-5"))  # fmt: skip
