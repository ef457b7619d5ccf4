"""Which checkpoint the pipeline exports: the best held-out score (slate: log-loss; summarize:
share answered), only where it beats the last checkpoint by more than its paired interval;
`grail export --checkpoint best|last|N` exports that model and says which step in the
manifest; the promotion gate then judges the exported checkpoint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from grail.cli import main
from grail.core.errors import GrailError
from grail.core.outputs import mark_complete
from grail.export.stage import export
from grail.tasks.slate.benchmark.scores import chosen_checkpoint, differences
from grail.tasks.slate.benchmark.systems import System
from grail.tasks.summarize.benchmark import chosen_summarizer


def rows(count: int = 120) -> list[dict]:
    """Three-option rows of `count` // 2 people; people chose option 1."""
    return [{"gold_index": 1, "participant_id": f"p{k // 2}"} for k in range(count)]


def model(step: int, first: float, count: int = 120, series: str = "grpo-gun") -> System:
    """A checkpoint that gives option 1 probability about `first` (noise of +-0.04 per row, in
    a pattern of its own per step)."""
    noise = [0.02 * ((7 * k + step) % 5 - 2) for k in range(count)]
    dists = [[first + e, (1 - first - e) / 2, (1 - first - e) / 2] for e in noise]
    return System(f"{series}@step-{step}", "model", distributions=dists, step=step, series=series)


def test_the_best_checkpoint_is_chosen_only_when_it_clearly_beats_the_last():
    data = rows()
    clear = [model(0, 0.34), model(2, 0.6), model(4, 0.4)]  # step 2: log 0.6 against log 0.4
    chosen = chosen_checkpoint(clear, data, "grpo-gun", 200)
    assert (chosen["step"], chosen["last_step"], chosen["system"]) == (2, 4, "grpo-gun@step-2")
    assert chosen["reason"].startswith("step 2's log-loss beats the last checkpoint's (step 4)")
    assert chosen["best_minus_last"]["ci"][1] < 0
    close = [model(0, 0.34), model(2, 0.405), model(4, 0.4)]  # a gap inside the interval
    chosen = chosen_checkpoint(close, data, "grpo-gun", 200)
    assert (chosen["step"], chosen["best_step"]) == (4, 2)
    assert chosen["reason"].startswith("the last checkpoint (step 4): step 2's log-loss")
    # the exported checkpoint is judged against always-first too
    prior = System("always_first", "baseline", distributions=[[0.5, 0.25, 0.25]] * 120)
    gaps = differences([*clear, prior], data, "grpo-gun", 200, None, "grpo-gun@step-2")
    assert gaps["chosen_minus_always_first"]["log_loss"]["difference"] < 0
    assert "chosen_minus_always_first" not in differences(
        [*close, prior], data, "grpo-gun", 200, None, "grpo-gun@step-4"
    )


def test_a_summarizers_best_checkpoint_is_chosen_by_share_answered():
    ids = [f"d{k}" for k in range(40)]
    scores = {
        "grpo@step-2": [{"answered": 0.8} for _ in ids],
        "grpo@step-4": [{"answered": 0.3 + 0.1 * (k % 2)} for k in range(40)],
    }
    systems = {
        name: {"series": "grpo", "step": int(name[-1]), "answered": {"mean": mean, "ci": [0, 1]}}
        for name, mean in (("grpo@step-2", 0.8), ("grpo@step-4", 0.35))
    }
    chosen = chosen_summarizer(systems, scores, ids, "grpo", 200)
    assert (chosen["step"], chosen["system"]) == (2, "grpo@step-2")
    # a higher mean, within its interval: the last is kept
    scores["grpo@step-2"] = [{"answered": 0.3 + 0.12 * ((k + 1) % 2)} for k in range(40)]
    systems["grpo@step-2"]["answered"]["mean"] = 0.36
    kept = chosen_summarizer(systems, scores, ids, "grpo", 200)
    assert (kept["step"], kept["best_step"]) == (4, 2)


def run_folder(tmp_path: Path, chosen: dict | None) -> tuple[Path, Path]:
    """A trained model folder (the final model, step 4) with the model of step 2 and its
    resume state in checkpoint-2, and a benchmark that chose `chosen`."""
    model = tmp_path / "model"
    for folder, weights in ((model, b"final"), (model / "checkpoint-2", b"step two")):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(weights)
    (model / "checkpoint-2" / "optimizer.pt").write_bytes(b"resume only")
    benchmark = tmp_path / "benchmark"
    benchmark.mkdir()
    (benchmark / "metrics.json").write_text(json.dumps({"chosen": chosen}))
    mark_complete(benchmark, "benchmark")
    return model, benchmark


def scored_by(benchmark: Path, model: Path) -> None:
    """The benchmark records the finished run `model` among those it scored, as the
    benchmark stage does (its ``runs``: the run marker's sha256)."""
    from grail.inference.specs import run_markers

    metrics = json.loads((benchmark / "metrics.json").read_text())
    metrics["runs"] = run_markers([str(model)])
    (benchmark / "metrics.json").write_text(json.dumps(metrics))
    mark_complete(benchmark, "benchmark")


def exported_weights(manifest: dict) -> str:
    return manifest["files"]["model/model.safetensors"]["sha256"]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_export_takes_the_chosen_checkpoint_a_given_step_or_the_last(tmp_path):
    chosen = {"step": 2, "last_step": 4, "best_step": 2, "reason": "step 2's log-loss beats"}
    model, benchmark = run_folder(tmp_path, chosen)
    best = export(model, benchmark, str(tmp_path / "best"), checkpoint="best")["manifest"]
    assert exported_weights(best) == sha(b"step two")
    assert best["exported"] == {"checkpoint": "best", "step": 2, "reason": chosen["reason"]}
    assert "model/optimizer.pt" not in best["files"]  # what only a resume reads stays
    last = export(model, benchmark, str(tmp_path / "last"), checkpoint="last")["manifest"]
    assert exported_weights(last) == sha(b"final") and last["exported"]["step"] == 4
    main(["export", "--model", str(model), "--benchmark", str(benchmark),
          "--dest", str(tmp_path / "two"), "--checkpoint", "2"])  # fmt: skip
    two = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert exported_weights(two) == sha(b"step two") and two["exported"]["step"] == 2
    with pytest.raises(GrailError, match="no model of step 3 in .* \\(its checkpoints: 2\\)"):
        export(model, benchmark, str(tmp_path / "three"), checkpoint="3")
    assert not (tmp_path / "three").exists()


def test_best_is_the_last_when_the_benchmark_kept_it(tmp_path):
    kept = {"step": 4, "last_step": 4, "best_step": 2, "reason": "the last checkpoint (step 4)"}
    model, benchmark = run_folder(tmp_path, kept)
    manifest = export(model, benchmark, str(tmp_path / "out"), checkpoint="best")["manifest"]
    assert exported_weights(manifest) == sha(b"final")
    assert manifest["exported"]["reason"] == kept["reason"]


def test_a_damaged_checkpoint_is_never_exported(tmp_path, capsys):
    """A checkpoint of a finished run whose weights were cut short or edited since the run
    recorded them (its marker: the model files' sha256s) is refused by a step and by
    ``best``, in the run's own folder and in a copy of it, with nothing written."""
    import os

    from grail.core.outputs import mark_complete

    chosen = {"step": 2, "last_step": 4, "best_step": 2, "reason": "step 2's log-loss beats"}
    model, benchmark = run_folder(tmp_path, chosen)
    weights = model / "checkpoint-2" / "model.safetensors"
    os.utime(weights, ns=(10**18, 10**18))  # written long before the edit below
    mark_complete(model, "train", unhashed="checkpoint-")
    scored_by(benchmark, model)
    import shutil

    copy = Path(shutil.copytree(model, tmp_path / "copy", copy_function=shutil.copyfile))
    (copy / "checkpoint-2" / "model.safetensors").write_bytes(b"step twX")  # `cp -r`, then a flip
    with pytest.raises(GrailError, match="checkpoint-2/model.safetensors:? (is )?not the file"):
        export(copy, benchmark, str(tmp_path / "from-copy"), checkpoint="2")
    assert not (tmp_path / "from-copy").exists()
    for damage in (b"step", b"step twX"):  # truncated; one byte flipped, the size kept
        weights.write_bytes(damage)
        for checkpoint in ("2", "best"):
            dest = tmp_path / f"out-{len(damage)}-{checkpoint}"
            with pytest.raises(
                GrailError, match="checkpoint-2/model.safetensors:? (is )?not the file"
            ):
                export(model, benchmark, str(dest), checkpoint=checkpoint)
            assert not dest.exists()
    status = main(["export", "--model", str(model), "--dest", str(tmp_path / "cli"),
                   "--checkpoint", "2"])  # fmt: skip
    assert status == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
    # the run's record no longer holds: not even its final model goes until it is repaired
    with pytest.raises(GrailError, match="checkpoint-2/model.safetensors is not the file"):
        export(model, benchmark, str(tmp_path / "last"), checkpoint="last")
    weights.write_bytes(b"step two")
    last = export(model, benchmark, str(tmp_path / "last"), checkpoint="last")["manifest"]
    assert exported_weights(last) == sha(b"final")


@pytest.mark.parametrize("step", ["1/../../../b/victim/secretmodel", "2", True, -2, 2.0, None])
def test_a_chosen_step_that_is_not_a_step_number_is_refused(tmp_path, step):
    """The benchmark's ``chosen.step`` names a folder below the run: a path, a string, a bool,
    a negative or a float is refused before anything is read or written."""
    model, benchmark = run_folder(tmp_path, {"step": step, "last_step": 4, "reason": "r"})
    victim = tmp_path / "b" / "victim" / "secretmodel"
    victim.mkdir(parents=True)
    (victim / "config.json").write_text("{}")
    with pytest.raises(GrailError, match="chosen.step is not a step number"):
        export(model, benchmark, str(tmp_path / "out"), checkpoint="best")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("checkpoint", ["²", "١", "-1", " 2"])
def test_a_checkpoint_that_is_not_ascii_digits_is_one_line(tmp_path, capsys, checkpoint):
    """``--checkpoint`` takes best, last or ASCII digits (Python's isdigit takes "²", which int()
    refuses, and "١", which it reads as 1); a ``checkpoint-²`` folder is listed as no step."""
    model, benchmark = run_folder(tmp_path, None)
    (model / "checkpoint-²").mkdir()
    status = main(["export", "--model", str(model), "--dest", str(tmp_path / "out"),
                   "--checkpoint", checkpoint])  # fmt: skip
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and "give best, last or a step number" in line
    with pytest.raises(GrailError, match=r"no model of step 7 .*\(its checkpoints: 2\)"):
        export(model, benchmark, str(tmp_path / "out"), checkpoint="7")


def test_a_file_added_to_a_finished_model_folder_is_never_exported(tmp_path, capsys):
    """A file put into a finished run's folder after its marker (a ``modeling_evil.py``, or a
    benchmark written inside it) was exported as part of the model: refused in one line,
    nothing written."""
    from grail.core.outputs import mark_complete

    model, benchmark = run_folder(tmp_path, None)
    mark_complete(model, "train", unhashed="checkpoint-")
    (model / "modeling_evil.py").write_text("import os")
    status = main(["export", "--model", str(model), "--dest", str(tmp_path / "out")])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and "modeling_evil.py was not written by train" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("where", "content", "words"),
    [
        ("benchmark/metrics.json", b"[]", "not a benchmark's metrics (not a JSON object)"),
        ("benchmark/metrics.json", b"{bad", "not a benchmark's metrics (not JSON)"),
        ("benchmark/metrics.json", b"\xff", "not a benchmark's metrics (not UTF-8)"),
        ("model/prompt.json", b"{bad", "not a prompt record (not JSON)"),
    ],
)
def test_a_malformed_record_beside_the_model_is_one_line(tmp_path, capsys, where, content, words):
    """A metrics.json or prompt.json that is not a JSON object was a traceback (exit 1), the
    prompt's after an empty destination folder was made: one line, exit 2, nothing made."""
    model, benchmark = run_folder(tmp_path, None)
    (tmp_path / where).write_bytes(content)
    mark_complete(benchmark, "benchmark")  # as written: the marker vouches for the bytes
    status = main(["export", "--model", str(model), "--benchmark", str(benchmark),
                   "--dest", str(tmp_path / "out"), "--checkpoint", "best"])  # fmt: skip
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and words in line, line
    assert not (tmp_path / "out").exists()


def test_a_benchmark_of_another_run_is_not_exported_beside_a_model(tmp_path, capsys):
    """``export --model A --benchmark B`` paired any model with any benchmark: B's metrics,
    its chosen checkpoint and the gate's decision on it went out as A's. A finished run goes
    only with a benchmark that scored it, byte for byte (its marker's sha256 in ``runs``)."""
    from grail.core.outputs import mark_complete

    chosen = {"step": 2, "last_step": 4, "best_step": 2, "reason": "step 2's log-loss beats"}
    model, benchmark = run_folder(tmp_path, chosen)
    mark_complete(model, "train", unhashed="checkpoint-")
    other, _ = run_folder(tmp_path / "b", chosen)
    (other / "model.safetensors").write_bytes(b"another run")
    mark_complete(other, "train", unhashed="checkpoint-")
    scored_by(benchmark, other)
    for checkpoint in ("best", "last"):
        dest = tmp_path / f"out-{checkpoint}"
        status = main(["export", "--model", str(model), "--benchmark", str(benchmark),
                       "--dest", str(dest), "--checkpoint", checkpoint])  # fmt: skip
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and len(err) == 1 and "not a benchmark of" in err[0], err
        assert "it scored model" in err[0] and not dest.exists()
    scored_by(benchmark, model)  # the benchmark of this run: it goes
    manifest = export(model, benchmark, str(tmp_path / "out"), checkpoint="best")["manifest"]
    assert exported_weights(manifest) == sha(b"step two")


def test_a_folder_inside_a_finished_run_is_not_exported_on_its_own(tmp_path, capsys):
    """``--model RUN/checkpoint-1`` or ``--model RUN/sft`` has no marker of its own: a byte
    flipped in a copy's checkpoint, or a file added to sft/, went out with rc 0 (probe B1).
    The run is exported whole, its step chosen with --checkpoint, where its marker checks it."""
    model, _ = run_folder(tmp_path, None)
    (model / "sft").mkdir()
    (model / "sft" / "config.json").write_text("{}")
    mark_complete(model, "train", unhashed="checkpoint-")
    (model / "checkpoint-2" / "model.safetensors").write_bytes(b"step twX")
    (model / "sft" / "modeling_evil.py").write_text("import os")
    for inside, hint in (("checkpoint-2", f"--model {model} --checkpoint 2"), ("sft", "")):
        dest = tmp_path / f"out-{inside}"
        status = main(["export", "--model", str(model / inside), "--dest", str(dest)])
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and f"is {inside} inside the finished output {model}" in line, line
        assert hint in line and not dest.exists()


def test_a_benchmark_without_its_marker_is_not_trusted(tmp_path, capsys):
    """A benchmark folder whose marker was removed, its metrics then edited (a forged
    ``chosen``, ``runs`` naming another run), exported with rc 0 (probe B2): read_benchmark
    trusts no metrics without the marker that vouches for them."""
    chosen = {"step": 2, "last_step": 4, "best_step": 2, "reason": "forged"}
    model, benchmark = run_folder(tmp_path, chosen)
    mark_complete(model, "train", unhashed="checkpoint-")
    scored_by(benchmark, model)
    (benchmark / "_COMPLETE.json").unlink()
    status = main(["export", "--model", str(model), "--benchmark", str(benchmark),
                   "--dest", str(tmp_path / "out"), "--checkpoint", "best"])  # fmt: skip
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and "no _COMPLETE.json: not a finished benchmark" in line, line
    assert not (tmp_path / "out").exists()


def test_a_run_whose_files_changed_is_not_scored_as_that_run(tmp_path):
    """A benchmark recorded a run's marker sha256 in ``runs`` for weights swapped in since the
    run finished (probe B3): each run is checked against its marker before it is scored."""
    from grail.core.errors import DataError
    from grail.inference.specs import run_markers

    model, _ = run_folder(tmp_path, None)
    mark_complete(model, "train", unhashed="checkpoint-")
    assert list(run_markers([str(model)])) == ["model"]
    (model / "model.safetensors").write_bytes(b"other")
    with pytest.raises(DataError, match="model.safetensors is not the file train wrote"):
        run_markers([str(model)])
