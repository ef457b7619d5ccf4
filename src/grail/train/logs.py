"""What training records and shows of its logs: ``metrics.json`` (with ``prompt.json``) beside
the model and in every checkpoint, one quiet line per log where stderr is no terminal, and the
series that cannot move left out of every log (MLflow's included).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from transformers import TrainerCallback

from grail.core.outputs import replace_text


class MetricsCallback(TrainerCallback):
    """Collects every training log with its step time into ``metrics.json`` (kept across resumes).

    The file is also written into each checkpoint folder, so a resumed run continues the record.
    """

    def __init__(self, resume_from: str | None = None, prompt: dict | None = None):
        self.prompt = prompt
        previous = Path(resume_from or "") / "metrics.json"
        self.rows: list[dict] = json.loads(previous.read_text()) if previous.is_file() else []
        self._step_started = self._last_log = time.perf_counter()
        self._steps_since_log = 0

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._steps_since_log += 1

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "train_runtime" in logs:
            return
        now = time.perf_counter()
        row = {"step": state.global_step, **logs}
        if self._steps_since_log and not any(k.startswith("eval_") for k in logs):
            row["step_time"] = (now - self._last_log) / self._steps_since_log
            self._last_log, self._steps_since_log = now, 0
        self.rows.append(row)

    def write(self, folder: str | Path) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        replace_text(Path(folder) / "metrics.json", json.dumps(self.rows, indent=1) + "\n")
        if self.prompt is not None:
            replace_text(Path(folder) / "prompt.json", json.dumps(self.prompt, indent=1) + "\n")

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.write(Path(args.output_dir) / f"checkpoint-{state.global_step}")


class StopOnNonFinite(TrainerCallback):
    """Stops training with one line at the first log whose loss or gradient norm is NaN or
    infinite (a learning rate far too high, a NaN in the inputs): the weights are NaN from then
    on, so nothing more is saved and the run leaves no model or summary behind.

    >>> StopOnNonFinite().on_log(None, type("S", (), {"global_step": 3})(), None,
    ...                          logs={"loss": float("nan")})
    Traceback (most recent call last):
    grail.core.errors.NonFiniteTraining: step 3: the training loss is nan: training stopped and no \
model saved (a learning rate too high, or a NaN in the data?)
    """

    KEYS = ("loss", "grad_norm", "eval_loss")

    def on_log(self, args, state, control, logs=None, **kwargs):
        import math

        from grail.core.errors import NonFiniteTraining

        for key in self.KEYS:
            value = (logs or {}).get(key)
            if isinstance(value, int | float) and not math.isfinite(value):
                what = {"loss": "training loss", "grad_norm": "gradient norm"}.get(key, key)
                raise NonFiniteTraining(
                    f"step {state.global_step}: the {what} is {value}: training stopped and no "
                    "model saved (a learning rate too high, or a NaN in the data?)"
                )


def check_finite_weights(model, where: str) -> None:
    """Refuse to save a model with a NaN or infinite weight (this process's shard under
    ZeRO-3): one line, no model written."""
    import torch

    from grail.core.errors import NonFiniteTraining

    for name, parameter in model.named_parameters():
        if parameter.numel() and not torch.isfinite(parameter.detach()).all():
            raise NonFiniteTraining(
                f"{where}: weight {name} is not finite: training stopped and no model saved"
            )


class LineLogCallback(TrainerCallback):
    """One quiet line per log when stderr is not a terminal (instead of a progress bar)."""

    KEYS = ("loss", "reward", "kl", "gail/disc_loss", "gail/disc_accuracy", "step_time")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "train_runtime" in logs:
            return
        shown = {
            k: v
            for k, v in logs.items()
            if isinstance(v, float | int)
            and (k in self.KEYS or k.startswith("rewards/") and k.endswith("/mean"))
        }
        fields = " ".join(
            f"{k.removeprefix('rewards/').removesuffix('/mean')}={v:.4g}" for k, v in shown.items()
        )
        print(f"step {state.global_step}/{state.max_steps} {fields}", flush=True)


def quiet_logs(trainer) -> None:
    """Without a progress bar, one compact line per log instead of transformers' dict dumps."""
    from transformers import PrinterCallback

    if trainer.args.disable_tqdm:
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(LineLogCallback())


class DropStillSeries(TrainerCallback):
    """Leaves out of every log the series that cannot move, so MLflow's charts open on what
    did: TRL's clip ratios when each generation batch gets one gradient step
    (``num_iterations`` 1: the policy ratio is exactly 1 and nothing is ever clipped)."""

    STILL = ("clip_ratio/", "cispo_clip_ratio")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and args.num_iterations == 1:
            for key in [k for k in logs if k.startswith(self.STILL)]:
                del logs[key]


def quiet_series(trainer) -> None:
    """Before every other callback sees a log (the MLflow one included): the still series
    out. TRL's ``profiling/Time taken: ...`` series go straight to MLflow, a point per call,
    whenever "mlflow" is in ``args.report_to`` (docs/pins.md#trl-116): the MLflow callback was
    made when the trainer was, and keeps logging the training metrics without it; ``step_time``
    stays, and each phase's seconds per logged step reach the logs as ``profiling/PHASE``
    (:func:`grail.train.overrides.phase_timings`)."""
    trainer.callback_handler.callbacks.insert(0, DropStillSeries())
    trainer.args.report_to = [r for r in trainer.args.report_to if r != "mlflow"]
