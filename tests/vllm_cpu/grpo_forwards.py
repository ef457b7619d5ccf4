"""Run by tests/test_vllm.py in a process of its own (vLLM's colocated engine lives in it, with
the torch.distributed group TRL's external launcher makes): build grail's GRPO trainer with
``use_vllm: true, vllm_mode: colocate`` from `grail train` arguments and train two optimizer
steps, counting each step's scoring forwards (tests/test_grpo_passes.py's ``Forwards``): step 1
as grail builds it, step 2 with ``ratio_from_training`` forced off (TRL's own no-grad "old"
log-prob forward). One engine serves both. Prints one JSON line: each step's counts.

Usage: ``python grpo_forwards.py ARGS...`` (`grail train` arguments, ``--max_steps 2``).

TRL's own weight sync into the engine runs: the test sets GRAIL_TEST_VLLM_LIVE_WEIGHTS=1, so
vLLM's CPU build keeps its linear weights live (tests/vllm_cpu/sitecustomize.py).
"""

import copy
import json
import sys
from collections import Counter

from test_grpo_passes import Forwards
from transformers import TrainerCallback

from grail.train.config import parse_train_args
from grail.train.trainer import build_trainer


def counted(method, calls: dict, key: str):
    """`method`, counting its calls into ``calls[key]``."""

    def call(*args, **kwargs):
        calls[key] += 1
        return method(*args, **kwargs)

    return call


class TRLFromStep2(TrainerCallback):
    """After step 1: keep its counts, and turn grail's ratio off for step 2."""

    def __init__(self, trainer, counts: dict):
        self.trainer, self.counts, self.first = trainer, counts, None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            self.first = copy.deepcopy(self.counts)
            self.trainer.ratio_from_training = False


def main(argv: list[str]) -> None:
    config, model_config = parse_train_args(argv)
    trainer, _ = build_trainer(config, model_config)
    generation = trainer.vllm_generation
    # vLLM's weight sync and generation (the completions are the engine's), grail's ratio
    calls = Counter()
    generation.sync_weights = counted(generation.sync_weights, calls, "vllm_sync")
    generation.generate = counted(generation.generate, calls, "vllm_generate")
    trainer.sampling_ratio = counted(trainer.sampling_ratio, calls, "sampling_ratio")
    built_with = trainer.ratio_from_training
    with Forwards(trainer) as forwards:
        counts = {"forwards": forwards.counts, "calls": calls}
        flip = TRLFromStep2(trainer, counts)
        trainer.add_callback(flip)
        trainer.train()
    steps = [flip.first, counts]
    steps[1] = {k: dict(counts[k] - flip.first[k]) for k in counts}  # step 2 alone

    def named(step):
        forwards = {f"{name} {grad}": n for (name, grad), n in sorted(step["forwards"].items())}
        return {"forwards": forwards, "calls": dict(step["calls"])}

    result = {
        "ratio_from_training": built_with,
        "steps": trainer.state.global_step,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "grail": named(steps[0]),
        "trl": named(steps[1]),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
