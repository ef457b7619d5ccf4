"""Run by tests/rehearsal/test_rehearsal.py in a process of its own (vLLM's engine lives in
it): build grail's GRPO trainer with ``use_vllm: true, vllm_mode: colocate`` from `grail train`
arguments, read the engine's log-probs of a fixed text, train, let TRL sync the weights, and
compare the engine with the trained policy: its parameters (read through vLLM's private model
runner: a test-only path) and its log-probs. Prints one JSON line."""

import json
import sys

import torch

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


def main(argv: list[str]) -> None:
    config, model_config = parse_train_args(argv)
    trainer, _ = build_trainer(config, model_config)
    generation = trainer.vllm_generation
    token_ids = trainer.processing_class(TEXT)["input_ids"]
    model = trainer.accelerator.unwrap_model(trainer.model)
    before = engine_log_probs(generation.llm, token_ids)
    untrained = policy_log_probs(model, token_ids)
    trainer.train()
    model = trainer.accelerator.unwrap_model(trainer.model)
    # TRL synced before step 2's generation: the engine holds step 1's weights, not step 2's.
    stale = parameter_gaps(generation.llm, model)
    generation.sync_weights()  # what TRL does before the next generation
    synced = parameter_gaps(generation.llm, model)
    after = engine_log_probs(generation.llm, token_ids)
    policy = policy_log_probs(model, token_ids)
    result = {
        "before": before,
        "untrained": untrained,
        "after": after,
        "policy": policy,
        "steps": trainer.state.global_step,
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
