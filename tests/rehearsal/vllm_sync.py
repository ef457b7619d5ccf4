"""Run by tests/rehearsal/test_rehearsal.py in a process of its own (vLLM's engine lives in
it): build grail's GRPO trainer with ``use_vllm: true, vllm_mode: colocate`` from `grail train`
arguments, read the engine's log-probs of a fixed text, train, let TRL sync the weights, and
read them again beside the trained policy's. Prints one JSON line."""

import json
import sys

import torch

from grail.train.config import parse_train_args
from grail.train.grpo import build_trainer

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


def main(argv: list[str]) -> None:
    config, model_config = parse_train_args(argv)
    trainer, _ = build_trainer(config, model_config)
    generation = trainer.vllm_generation
    token_ids = trainer.processing_class(TEXT)["input_ids"]
    before = engine_log_probs(generation.llm, token_ids)
    trainer.train()
    generation.sync_weights()  # what TRL does before each generation after a step
    after = engine_log_probs(generation.llm, token_ids)
    model = trainer.accelerator.unwrap_model(trainer.model)
    policy = policy_log_probs(model, token_ids)
    steps = trainer.state.global_step
    print(json.dumps({"before": before, "after": after, "policy": policy, "steps": steps}))


if __name__ == "__main__":
    main(sys.argv[1:])
