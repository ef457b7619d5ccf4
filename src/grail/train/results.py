"""What a run leaves in ``output_dir`` besides the trainer's own saves: the step a checkpoint
was saved at (and whether it already finished the run, so a resume trains nothing), a
checkpoint's model files copied out as the final model, and the result of behaviour cloning
alone (``rl`` false: the warm start's model is the run's).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

from grail.core.outputs import MARKER, mark_complete, replace_file, replace_text, strays
from grail.train.config import TrainConfig
from grail.train.examples import prompt_record

logger = logging.getLogger(__name__)


def start_step(checkpoint: str | None) -> int:
    """The global step a checkpoint folder was saved at (0 without one)."""
    state = Path(checkpoint or "") / "trainer_state.json"
    return int(json.loads(state.read_text())["global_step"]) if state.is_file() else 0


def finished_step(checkpoint: str | None, max_steps: int) -> int | None:
    """The checkpoint's step when it already reached the run's last step, else None.

    Resuming a finished run must train nothing: transformers would run one more step. The
    target is ``max_steps`` when set, else the one the checkpoint was trained towards.
    """
    state = Path(checkpoint or "") / "trainer_state.json"
    if not state.is_file():
        return None
    saved = json.loads(state.read_text())
    target = max_steps if max_steps and max_steps > 0 else saved.get("max_steps", 0)
    return saved["global_step"] if target and saved["global_step"] >= target else None


TRAINING_STATE = ("optimizer.pt", "scheduler.pt", "trainer_state.json", "latest", "zero_to_")


def copy_model_files(checkpoint: Path, out: Path) -> None:
    """The model files of a checkpoint (what ``save_model`` writes: weights, config, tokenizer,
    metrics) into `out`; not its optimizer, scheduler, RNG or DeepSpeed shard state, nor
    grail's own markers (``_COMPLETE.json``, ``_WRITER.json``: they describe the source)."""
    out.mkdir(parents=True, exist_ok=True)
    for path in checkpoint.iterdir():
        if path.is_file() and not path.name.startswith((*TRAINING_STATE, "rng_state", "_")):
            replace_file(out / path.name, lambda staged, p=path: shutil.copy2(p, staged))


def cloned_result(config: TrainConfig, start: str, sft_model: str, started: float) -> dict:
    """With ``rl`` false the warm start's model is the result (behaviour cloning alone): its
    files, metrics and prompt in ``output_dir``, its SFT steps as the run's last step, and the
    model it started from as step 0, so the benchmark scores what cloning added."""
    from accelerate import PartialState

    sft, out = Path(sft_model), Path(config.output_dir)
    rows = (
        json.loads((sft / "metrics.json").read_text()) if (sft / "metrics.json").is_file() else []
    )
    step = max((int(r.get("step", 0)) for r in rows), default=0)
    if Path(start).expanduser().exists():
        start = str(Path(start).expanduser().resolve())
    summary = {
        "global_step": step,
        "steps_trained": step,
        "resumed_from": None,
        "seconds": round(time.perf_counter() - started, 2),
        "world_size": PartialState().num_processes,
        "output_dir": config.output_dir,
        "reward_funcs": [],
        "reward_weights": [],
        "sft_model": sft_model,
        "start_model": start,
    }
    if PartialState().is_main_process:
        stray = not_written(out)
        copy_model_files(sft, out)
        replace_text(out / "prompt.json", json.dumps(prompt_record(config), indent=1) + "\n")
        replace_text(out / "summary.json", json.dumps(summary, indent=1))
        mark_complete(out, "train", unhashed="checkpoint-", leave_out=stray)
    return summary


def not_written(out: Path) -> list[str]:
    """What someone put in `out` while training ran (:func:`grail.core.outputs.strays`),
    found before the final model is written beside it: named in a warning, left where it is,
    and left out of the finished run's marker (so no later command takes it for training's)."""
    found = strays(out.resolve(), "train")
    if found:
        logger.warning(
            "output_dir %s: %s appeared while training ran (not written by grail train): left "
            "where it is, and not listed as the run's output (%s)",
            out,
            ", ".join(found),
            MARKER,
        )
    return found
