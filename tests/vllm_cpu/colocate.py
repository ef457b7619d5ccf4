"""Run by tests/test_vllm.py in a process of its own (vLLM's colocated engine lives in it, with
the torch.distributed group TRL's external launcher makes): build grail's GRPO trainer with
``use_vllm: true, vllm_mode: colocate`` from `grail train` arguments and train two optimizer
steps, then check TRL's weight sync against the trained policy. One engine serves both checks.

- Each step's scoring forwards, counted (tests/test_grpo_passes.py's ``Forwards``): step 1 as
  grail builds it, step 2 with ``ratio_from_training`` forced off (TRL's own no-grad "old"
  log-prob forward).
- The sync: the engine's log-probs of a fixed text before training, the engine's parameters
  after training (read through vLLM's private model runner: a test-only path) against the
  trained policy's, before and after one more sync, and the engine's log-probs after it.

Prints one JSON line. Usage: ``python colocate.py ARGS...`` (`grail train` arguments,
``--max_steps 2``).

TRL's own weight sync into the engine runs: the test sets GRAIL_TEST_VLLM_LIVE_WEIGHTS=1, so
vLLM's CPU build keeps its linear weights live (tests/vllm_cpu/sitecustomize.py).
"""

import copy
import json
import sys
from collections import Counter

import torch
from test_grpo_passes import Forwards
from transformers import TrainerCallback

from grail.train.config import parse_train_args
from grail.train.trainer import build_trainer

TEXT = "VIEWER: a 30-year-old who watches videos about guns.\nOPTIONS\n1. A\n2. B"


def engine_log_probs(llm, token_ids: list[int]) -> list[float]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    (output,) = llm.generate([TokensPrompt(prompt_token_ids=token_ids)], params, use_tqdm=False)
    return [
        entry[token].logprob
        for entry, token in zip(output.prompt_logprobs[1:], token_ids[1:], strict=True)
    ]


@torch.no_grad()
def policy_log_probs(model, token_ids: list[int]) -> list[float]:
    ids = torch.tensor([token_ids], device=model.device)
    logits = model(input_ids=ids).logits.float().log_softmax(-1)[0, :-1]
    return logits.gather(-1, ids[0, 1:, None])[:, 0].tolist()


def engine_model(llm):
    """The engine's torch module (one process, VLLM_ENABLE_V1_MULTIPROCESSING=0 as TRL's colocate
    sets it)."""
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner.model


def parameter_gaps(llm, model) -> dict[str, float]:
    """Per engine parameter, the largest difference from the policy's parameters cast to the
    engine's dtype. vLLM fuses q/k/v and gate/up (its `packed_modules_mapping`, concatenated on
    dim 0) and pads the vocabulary (rows past the policy's are padding)."""
    engine = engine_model(llm)
    packed = getattr(engine, "packed_modules_mapping", {})
    policy = dict(model.named_parameters())
    gaps = {}
    for name, param in engine.named_parameters():
        module, _, leaf = name.rpartition(".")
        prefix, _, short = module.rpartition(".")
        parts = [f"{prefix}.{part}.{leaf}" for part in packed.get(short, [])] or [name]
        expected = torch.cat([policy[part].detach() for part in parts]).to(param.dtype)
        rows = param.data[: expected.shape[0]]
        gaps[name] = (rows.float() - expected.float()).abs().max().item()
    return gaps


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
    token_ids = trainer.processing_class(TEXT)["input_ids"]
    model = trainer.accelerator.unwrap_model(trainer.model)
    before = engine_log_probs(generation.llm, token_ids)
    untrained = policy_log_probs(model, token_ids)
    # vLLM's weight sync and generation (the completions are the engine's), grail's ratio
    calls = Counter()
    sync_weights = generation.sync_weights
    generation.sync_weights = counted(sync_weights, calls, "vllm_sync")
    generation.generate = counted(generation.generate, calls, "vllm_generate")
    trainer.sampling_ratio = counted(trainer.sampling_ratio, calls, "sampling_ratio")
    built_with = trainer.ratio_from_training
    with Forwards(trainer) as forwards:
        counts = {"forwards": forwards.counts, "calls": calls}
        flip = TRLFromStep2(trainer, counts)
        trainer.add_callback(flip)
        trainer.train()
    steps = [flip.first, {k: dict(counts[k] - flip.first[k]) for k in counts}]  # step 2 alone

    def named(step):
        forwards = {f"{name} {grad}": n for (name, grad), n in sorted(step["forwards"].items())}
        return {"forwards": forwards, "calls": dict(step["calls"])}

    model = trainer.accelerator.unwrap_model(trainer.model)
    # TRL synced before step 2's generation: the engine holds step 1's weights, not step 2's.
    stale = parameter_gaps(generation.llm, model)
    sync_weights()  # what TRL does before the next generation
    synced = parameter_gaps(generation.llm, model)
    result = {
        "ratio_from_training": built_with,
        "steps": trainer.state.global_step,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "grail": named(steps[0]),
        "trl": named(steps[1]),
        "before": before,
        "untrained": untrained,
        "after": engine_log_probs(generation.llm, token_ids),
        "policy": policy_log_probs(model, token_ids),
        "engine_dtype": str(next(engine_model(generation.llm).parameters()).dtype),
        "policy_dtype": str(next(model.parameters()).dtype),
        "stale": stale,
        "synced": synced,
        # what the trainer logged (the rows metrics.json and MLflow's callback receive)
        "logged": sorted({key for row in trainer.state.log_history for key in row}),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
