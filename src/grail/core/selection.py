"""Which checkpoint of a run the pipeline exports: the one with the best held-out score (the
slate task: log-loss; the summarize task: the share of questions answered), never the
training reward, and only where it beats the run's last checkpoint by more than its paired
interval; otherwise the last. Picking the best of several checkpoints on the rows that score
them favours it a little (a winner's curse): the interval guards against taking noise for a
better model, and the report names the step and why."""

from __future__ import annotations

import math
from collections.abc import Callable


def finite(*values) -> bool:
    """Whether every value is a real number (an int or float, not a bool, not NaN or
    infinite): a score a decision may rest on.

    >>> finite(1, -0.5), finite(float("nan")), finite(True), finite(None), finite("1")
    (True, False, False, False, False)
    """
    return all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values
    )


RULE = "best held-out {metric}, only where it beats the last checkpoint by more than its interval"


def choose_checkpoint(
    means: dict[int, float],
    difference: Callable[[int, int], dict],
    lower_is_better: bool,
    metric: str,
) -> dict:
    """The checkpoint to export, from each checkpoint's held-out mean (`means`: step -> mean
    over the validation rows; the run's checkpoints, step 0 left out) and the paired
    difference of two steps' scores (`difference(a, b)`: a minus b, with ``ci``).

    >>> gaps = {(2, 4): {"difference": -0.05, "ci": [-0.08, -0.02]}}
    >>> chosen = choose_checkpoint({2: 1.20, 4: 1.25}, lambda a, b: gaps[a, b], True, "log-loss")
    >>> chosen["step"], chosen["reason"]
    (2, "step 2's log-loss beats the last checkpoint's (step 4) by -0.050 [-0.080, -0.020]")
    >>> gaps = {(2, 4): {"difference": -0.01, "ci": [-0.04, 0.02]}}
    >>> choose_checkpoint({2: 1.24, 4: 1.25}, lambda a, b: gaps[a, b], True, "log-loss")["step"]
    4
    >>> choose_checkpoint({4: 1.25}, None, True, "log-loss")["reason"]
    'the last checkpoint (step 4) has the best log-loss'
    >>> choose_checkpoint({2: float("nan"), 4: 1.25}, None, True, "log-loss")["step"]
    4
    """
    last = max(means)
    sign = 1 if lower_is_better else -1
    scored = [step for step in means if finite(means[step])] or [last]  # NaN is never best
    best = min(scored, key=lambda step: (sign * means[step], -step))  # a tie: the later step
    chosen = {"rule": RULE.format(metric=metric), "last_step": last, "best_step": best}
    if best == last:
        reason = f"the last checkpoint (step {last}) has the best {metric}"
        return chosen | {"step": last, "reason": reason}
    gap = difference(best, last)
    low, high = gap["ci"]
    figures = f"{gap['difference']:+.3f} [{low:+.3f}, {high:+.3f}]"
    chosen["best_minus_last"] = gap
    beats = (high < 0) if lower_is_better else (low > 0)
    if beats and finite(gap["difference"], low, high):
        reason = f"step {best}'s {metric} beats the last checkpoint's (step {last}) by {figures}"
        return chosen | {"step": best, "reason": reason}
    reason = (
        f"the last checkpoint (step {last}): step {best}'s {metric} differs by {figures}, "
        "within its interval"
    )
    return chosen | {"step": last, "reason": reason}
