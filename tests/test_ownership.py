"""Nothing a user owns is deleted by any command: each writer writes only into a folder that is
empty or that the same command wrote before (its marker lists every file it wrote, with its
sha256), never through a symbolic link; `grail train` never writes over what it reads. Each case
failed on main before (the command went on with exit 0 and deleted or overwrote the files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grail.cli import main
from grail.core.outputs import mark_complete

ROOT = Path(__file__).resolve().parents[1]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _trained_model(folder: Path) -> Path:
    """What `grail train` leaves: weights, a checkpoint, its marker, and the user's notes."""
    (folder / "checkpoint-2").mkdir(parents=True)
    (folder / "checkpoint-2" / "model.safetensors").write_bytes(b"step 2")
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "config.json").write_text("{}\n")
    mark_complete(folder, "train")
    (folder / "NOTES.txt").write_text("the run I keep\n")
    return folder


def _refused(argv: list[str], capsys, *expected: str) -> str:
    assert main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "Traceback" not in last
    for text in expected:
        assert text in last, last
    return last


def test_clean_into_a_trained_model_is_refused_and_deletes_nothing(tiny_raw, tmp_path, capsys):
    model = _trained_model(tmp_path / "model")
    before = _snapshot(model)
    _refused(
        ["clean", "--raw", str(tiny_raw), "--out", str(model)],
        capsys,
        "is the output of `grail train`",
        "choose another output folder",
    )
    assert _snapshot(model) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["benchmark", "--data", "{clean}", "--limit", "5", "--out"],
        ["tiny-model", "--out"],
        ["simulate", "--participants", "20", "--out"],
        ["simulate", "--task", "summarize", "--documents", "3", "--out"],
    ],
    ids=["benchmark", "tiny-model", "simulate", "simulate-documents"],
)
def test_every_writer_refuses_another_commands_output(argv, small_clean, tmp_path, capsys):
    model = _trained_model(tmp_path / "model")
    before = _snapshot(model)
    argv = [a.replace("{clean}", str(small_clean)) for a in argv]
    _refused([*argv, str(model)], capsys, str(model), "`grail train`")
    assert _snapshot(model) == before


def test_simulate_over_a_real_export_is_refused(tmp_path, capsys):
    """A raw export (no marker): its surveys and sessions were overwritten before."""
    raw = tmp_path / "raw"
    (raw / "surveys").mkdir(parents=True)
    (raw / "surveys" / "study1.csv").write_text("real,survey\n")
    (raw / "sessions.json").write_text("[]\n")
    before = _snapshot(raw)
    _refused(
        ["simulate", "--participants", "20", "--out", str(raw)],
        capsys,
        "holds files that no grail stage wrote",
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "repliqa.jsonl").write_text('{"real": 1}\n')
    _refused(
        ["simulate", "--task", "summarize", "--documents", "3", "--out", str(tmp_path / "docs")],
        capsys,
        "holds files that no grail stage wrote",
    )
    assert _snapshot(raw) == before
    assert (tmp_path / "docs" / "repliqa.jsonl").read_text() == '{"real": 1}\n'


def test_a_command_reruns_over_its_own_output_but_not_over_a_file_added_or_edited(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["simulate", "--participants", "20", "--out", str(out)]) == 0
    assert main(["simulate", "--participants", "20", "--out", str(out)]) == 0  # its own: replaced
    (out / "NOTES.txt").write_text("mine\n")
    _refused(
        ["simulate", "--participants", "20", "--out", str(out)],
        capsys,
        "NOTES.txt was not written by `grail simulate`; it is not deleted",
    )
    (out / "NOTES.txt").unlink()
    truth = out / "truth.json"
    truth.write_text(truth.read_text().replace("{", "{ ", 1))
    _refused(
        ["simulate", "--participants", "20", "--out", str(out)],
        capsys,
        "truth.json was changed since it was written by `grail simulate`",
    )
    assert truth.read_text().startswith("{ ")


def test_an_output_folder_that_is_a_link_is_never_written_through(tiny_raw, tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "out").symlink_to(victim, target_is_directory=True)
    _refused(
        ["clean", "--raw", str(tiny_raw), "--out", str(tmp_path / "out")],
        capsys,
        "is a symbolic link",
    )
    assert list(victim.iterdir()) == []
    assert (tmp_path / "out").is_symlink()


def test_a_link_inside_a_commands_own_output_is_not_followed_or_removed(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["simulate", "--participants", "20", "--out", str(out)]) == 0
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep\n")
    (out / "trees-link").symlink_to(victim, target_is_directory=True)
    _refused(["simulate", "--participants", "20", "--out", str(out)], capsys, "trees-link")
    assert (victim / "keep.txt").read_text() == "keep\n"


def _train(argv: list[str]) -> list[str]:
    recipe = ROOT / "recipes" / "tiny" / "config_grpo.yaml"
    return ["train", "--config", str(recipe), *argv]


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("{model}", "is model_name_or_path"),
        ("{model}/trained", "is inside model_name_or_path"),
        ("{data}/run", "is inside dataset"),
        ("{parent}", "holds model_name_or_path"),
    ],
)
def test_train_never_writes_over_what_it_reads(
    where, said, tiny_policy, small_clean, tmp_path, capsys
):
    """Before, `--output_dir <the start model>` overwrote the base weights and the user's README,
    and step 0's benchmark then scored the trained weights."""
    model = tmp_path / "start" / "model"
    model.parent.mkdir()
    os.symlink(tiny_policy, model)  # the model, as a user's path to it
    model = model.resolve()
    before = _snapshot(model)
    out = where.format(model=model, data=small_clean, parent=model.parent)
    argv = ["--model_name_or_path", str(model), "--dataset", str(small_clean)]
    _refused(_train([*argv, "--output_dir", out]), capsys, said, "choose another output_dir")
    assert _snapshot(model) == before


def test_train_into_a_folder_of_someone_elses_files_is_refused(
    tiny_policy, small_clean, tmp_path, capsys
):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "README.md").write_text("my notes\n")
    argv = ["--model_name_or_path", str(tiny_policy), "--dataset", str(small_clean)]
    _refused(_train([*argv, "--output_dir", str(out)]), capsys, "no grail stage wrote")
    assert [p.name for p in out.iterdir()] == ["README.md"]
