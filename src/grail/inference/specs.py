"""The models a ``grail benchmark --model SPEC`` names:

- a model folder (``config.json`` inside): evaluated in-process (:mod:`grail.inference.local`);
- a training output folder (``checkpoint-N`` folders inside) or a ``checkpoint_uri``
  (``s3://...``, ``file://...``): every checkpoint, giving accuracy per training step, plus the
  final model when the folder holds one, and the model training started from as step 0;
- ``openai:NAME@URL``: an OpenAI-compatible server (``vllm serve``, ``transformers serve``) at URL;
- ``openai:NAME``: the OpenAI API itself, when ``OPENAI_API_KEY`` is set
  (:mod:`grail.inference.remote`).

And how a local model was trained to be asked (:func:`trained_prompt`: its ``prompt.json``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

from grail.core.checkpoints import CHECKPOINT
from grail.core.errors import GrailError
from grail.core.outputs import MARKER, check_complete, read_record, sha256
from grail.core.serving import ModelSpec, openai_spec

logger = logging.getLogger(__name__)


def expand_spec(spec: str, download_to: Path, start: str | None = None) -> list[ModelSpec]:
    """The model(s) a spec names (see module docstring); `start`: the model a training output
    started from (default: its summary.json's ``start_model``), scored as its step 0."""
    if spec.startswith("openai:"):
        return [openai_spec(spec)]
    if spec.startswith(("s3://", "file://")):
        from grail.core.checkpoints import checkpoint_runs, complete_checkpoints
        from grail.core.storage import Location, check_uri, download_folder

        try:  # a '..' or '.' segment: S3 reads it as a literal key, a folder path goes up
            check_uri(spec)
        except GrailError as error:
            raise GrailError(f"--model {error}") from None
        found = complete_checkpoints(spec)
        if not found:
            raise GrailError(f"--model {spec}: no complete checkpoint there")
        runs = checkpoint_runs(spec)
        named = sorted({run for run in runs.values() if run})
        if len(named) > 1:  # one series would mix two trainings' steps
            steps = ", ".join(f"{step} ({run or '?'})" for step, run in sorted(runs.items()))
            raise GrailError(
                f"--model {spec}: its checkpoints come from {len(named)} runs "
                f"({', '.join(named)}; steps {steps}); score one run's checkpoint_uri"
            )
        label = Location.parse(spec).prefix.rstrip("/").rsplit("/", 1)[-1] or "checkpoints"
        for name in found.values():
            download_folder(Location.parse(spec).child(name), download_to / label / name)
        return _local_specs(download_to / label, label)
    folder = Path(spec)
    if not folder.is_dir():
        raise GrailError(f"--model {spec}: not a folder, checkpoint URI or openai: spec")
    specs = _local_specs(folder, folder.name, start)
    if not specs:
        raise GrailError(f"--model {spec}: no config.json and no checkpoint-N folders inside")
    return specs


def expand_specs(specs: list[str], download_to: Path, start: str | None) -> list[ModelSpec]:
    """Every model the specs name (:func:`expand_spec`); the first (the trained one) with
    `start` as its step 0."""
    starts = [start] + [None] * (len(specs) - 1)
    return [
        spec
        for text, first in zip(specs, starts, strict=False)
        for spec in expand_spec(text, download_to, first)
    ]


def _local_specs(folder: Path, label: str, start: str | None = None) -> list[ModelSpec]:
    checkpoints = sorted(
        (int(CHECKPOINT.match(p.name).group(1)), p)
        for p in folder.glob("checkpoint-*")
        if CHECKPOINT.match(p.name) and (p / "config.json").is_file()
    )
    specs = [
        ModelSpec(f"{label}@step-{step}", "local", path=str(path), step=step, series=label)
        for step, path in checkpoints
    ]
    summary = (
        json.loads((folder / "summary.json").read_text())
        if (folder / "summary.json").is_file()
        else {}
    )
    start = start or summary.get("start_model")
    if start and (folder / "config.json").is_file():  # step 0: the model training started from
        if looks_missing(start):
            logger.warning("%s: its starting model %s is not here: no step 0", folder, start)
        else:
            specs.insert(0, start_spec(start, label, folder))
    if (folder / "config.json").is_file():
        step = summary.get("global_step")
        if step is None and CHECKPOINT.match(folder.name):
            step = int(CHECKPOINT.match(folder.name).group(1))
        if not any(s.step == step for s in specs):
            specs.append(
                ModelSpec(
                    label if not specs else f"{label}@final",
                    "local",
                    path=str(folder),
                    step=step,
                    series=label if specs else None,
                )
            )
    return specs


def looks_missing(model: str) -> bool:
    """A model path (not a hub id) that is not on this machine.

    >>> looks_missing("/no/such/folder"), looks_missing("Qwen/Qwen2.5-1.5B-Instruct")
    (True, False)
    """
    path = Path(model).expanduser()
    return not path.exists() and (
        path.is_absolute() or model.startswith(".") or model.count("/") != 1
    )


def start_spec(model: str, series: str, trained: Path) -> ModelSpec:
    """The starting model of a training run as its step 0, asked the way the run's model is
    (the prompt.json in `trained`)."""
    return ModelSpec(
        f"{series}@step-0", "local", path=model, step=0, series=series, asked_as=str(trained)
    )


def trained_prompt(spec: ModelSpec) -> dict:
    """How a local model was trained to be asked (``prompt.json`` in its folder, or in the
    training output a checkpoint belongs to); {} when unknown (API models, foreign models)."""
    if spec.kind != "local":
        return {}
    if spec.asked_as:  # a starting model is asked the way its training run asks
        return trained_prompt(replace(spec, path=spec.asked_as, asked_as=None))
    for folder in (Path(spec.path), Path(spec.path).parent):
        if (folder / "prompt.json").is_file():
            return read_record(folder / "prompt.json", "a prompt record")
    return {}


TRAINING_FIELDS = ("rl_signal", "rl_signal_stopped_at", "discriminator_pretrained")


def training_records(specs: list[str]) -> dict[str, dict]:
    """What each training output among `specs` said of its run (``summary.json``: whether RL
    had signal, the discriminator's pre-training), by its label (the folder's name, as
    :func:`expand_spec` labels it); training outputs elsewhere (``s3://``) say nothing here.

    >>> training_records(["openai:gpt-4o", "/no/such/folder"])
    {}
    """
    found = {}
    for spec in specs:
        summary = Path(spec) / "summary.json"
        if spec.startswith(("openai:", "s3://", "file://")) or not summary.is_file():
            continue
        record = json.loads(summary.read_text())
        kept = {k: record[k] for k in TRAINING_FIELDS if record.get(k) is not None}
        if kept:
            found[Path(spec).name] = kept
    return found


def run_markers(specs: list[str]) -> dict[str, str]:
    """The sha256 of the completion marker of each local grail output among `specs` (a
    training run's folder), by its label (the folder's name): which runs, byte for byte, a
    benchmark scored, so that an export pairs a model only with a benchmark of it
    (:func:`grail.export.stage.check_benchmarked`).

    Each run is checked against its marker first (its files those it recorded: a run whose
    weights were swapped since is refused in one line), so that a recorded sha256 vouches for
    the bytes scored. Called before any scoring.

    >>> run_markers(["openai:gpt-4o", "/no/such/folder"])
    {}
    """
    runs = {}
    for spec in specs:
        folder = Path(spec)
        if spec.startswith(("openai:", "s3://", "file://")) or not (folder / MARKER).is_file():
            continue
        check_complete(folder)
        runs[folder.name] = sha256(folder / MARKER)
    return runs
