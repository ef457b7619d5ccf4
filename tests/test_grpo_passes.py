"""What one GRPO optimizer step costs, guarded on CPU (grail.train.grpo, grail.train.memory):
forwards counted per pass, a FLOP budget, a dtype audit, weight casts per generation, the vLLM
importance ratio from the training forward, the memory estimate, and the refusal of TRL's
continuous batching."""

from __future__ import annotations

import copy
import warnings
from collections import Counter, defaultdict

import pytest
import torch
from tiny_settings import tiny_args
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2Config, Qwen2ForCausalLM
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

from grail.core.errors import GrailError
from grail.train.attention import check_trainable, segment_block_mask
from grail.train.config import parse_train_args
from grail.train.examples import load_examples
from grail.train.grpo import (
    attention_pair_cost,
    pack_groups,
    reference_linears_in_bf16,
    segment_mask,
    shares_prompts_exactly,
    shuffle_groups,
    trimmed,
    worth_packing,
)
from grail.train.memory import Shape, activation_bytes_per_token, plan
from grail.train.trainer import build_trainer

GA = 2  # micro-batches per optimizer step
MICRO = 4  # completions per micro-batch: 2 prompts x 2
# one optimizer step's FLOPs per token (prompt and completion), in units of 2N (N: all parameters):
# generation (1), the policy's training forward (1) and backward (2), the reference's forward (1)
# make 5, less the LM head at prompt positions (it scores completions only), which is much of a
# tiny model's N: measured 3.1 with every completion's row carrying its prompt, 2.14 with each
# group's prompt read once by the scoring forwards (share_group_prompts), 1.89 with it prefilled
# once in generation too. A pass over padding, an extra forward or prompts read per completion
# again, in scoring or in generation, moves it past 2.
FLOP_UNITS = 2


def _tiny_qwen(tied: bool, hidden_size: int = 32, heads: int = 4) -> Qwen2ForCausalLM:
    """A tiny random Qwen2 model, `heads` query heads sharing 2 key/value heads."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=101,
        hidden_size=hidden_size,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    return Qwen2ForCausalLM(config).eval()


@pytest.mark.parametrize("tied", [True, False])
def test_reference_linears_in_bf16_score_bit_identically_under_autocast(tied):
    model = _tiny_qwen(tied)
    reference = copy.deepcopy(model)
    cast = reference_linears_in_bf16(reference)
    assert cast == 2 * 7 + (0 if tied else 1)  # q k v o gate up down per layer, the head
    assert reference.model.embed_tokens.weight.dtype == torch.float32
    assert reference.model.norm.weight.dtype == torch.float32
    assert reference.lm_head.weight.dtype == (torch.float32 if tied else torch.bfloat16)
    ids = torch.randint(101, (3, 17))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(model(ids).logits, reference(ids).logits)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(p.numel() * p.element_size() for p in reference.parameters()) < 0.8 * weights


def test_trimmed_keeps_every_used_column_and_never_cuts_the_completion():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]])
    assert trimmed(mask, 3) == (1, 2)
    assert trimmed(torch.tensor([[1, 1, 1, 1]]), 2) == (0, 2)
    assert trimmed(torch.tensor([[0, 1, 0, 0]]), 2) == (1, 1)  # an empty completion keeps one


@pytest.fixture(scope="module")
def trainer(small_clean, tiny_policy, tmp_path_factory):
    """A tiny GRPO trainer under bf16 autocast on CPU (the GPU recipes' precision): GA
    micro-batches of MICRO completions, a KL term (so a reference model)."""
    out = tmp_path_factory.mktemp("grpo_passes")
    config, model_config = parse_train_args(
        tiny_args(small_clean, tiny_policy, out)
        + [
            "--bf16",
            "true",
            "--per_device_train_batch_size",
            str(MICRO),
            "--gradient_accumulation_steps",
            str(GA),
            "--num_generations",
            "2",
            "--beta",
            "0.1",
            "--max_steps",
            "1",
            "--save_strategy",
            "no",
            "--gradient_checkpointing",
            "false",
        ]  # fmt: skip
    )
    built, _ = build_trainer(config, model_config)
    return built


class Forwards:
    """Scoring forwards (TRL's fused head: training, old and reference log-probs) of the policy
    and the reference, with and without gradient; generation's forwards are not counted."""

    def __init__(self, trainer):
        self.counts, self.tokens, self.read = Counter(), 0, 0
        self.rows = defaultdict(list)  # each forward's rows (a packed group is one row)
        self.trainer = trainer
        self.handles = [
            trainer.model.register_forward_pre_hook(self.hook("policy"), with_kwargs=True),
            trainer.ref_model.register_forward_pre_hook(self.hook("reference"), with_kwargs=True),
        ]
        scoring = trainer._get_per_token_logps_and_entropies

        def counted(model, input_ids, attention_mask, *args, **kwargs):
            if model is trainer.ref_model:  # the step's tokens, as TRL lays them out
                self.tokens += int(attention_mask.sum())
            return scoring(model, input_ids, attention_mask, *args, **kwargs)

        trainer._get_per_token_logps_and_entropies = counted

    def hook(self, name):
        def count(module, args, kwargs):
            if kwargs.get("fused_lm_head"):
                grad = "grad" if torch.is_grad_enabled() else "no_grad"
                self.counts[name, grad] += 1
                if name == "reference":  # the positions the reference's forwards read
                    self.read += kwargs["input_ids"].numel()
                self.rows[name, grad].append(kwargs["input_ids"].size(0))

        return count

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        del self.trainer._get_per_token_logps_and_entropies

    def __enter__(self):
        return self


def test_one_optimizer_step_runs_each_pass_once_within_its_flop_budget(trainer):
    """Per optimizer step: the policy's training forward once per micro-batch, the reference
    once per micro-batch, no other policy forward; FLOPs within FLOP_UNITS x 2N per token."""
    parameters = sum(p.numel() for p in trainer.model.parameters())
    flops = FlopCounterMode(display=False)
    with Forwards(trainer) as forwards, flops:
        trainer.train()
    assert trainer.state.global_step == 1
    assert forwards.counts == {
        ("policy", "grad"): GA,
        ("reference", "no_grad"): GA,  # TRL's chunks: one per micro-batch
    }
    tokens = forwards.tokens  # the step's real (unpadded) tokens, prompts and completions
    assert tokens > 0
    assert forwards.read < tokens  # each group's prompt read once (share_group_prompts)
    assert forwards.rows["policy", "grad"] == [MICRO // 2] * GA  # a group, a packed row
    total = flops.get_total_flops()
    print(f"step FLOPs {total:.3g}: {total / (2 * parameters * tokens):.2f} x 2N x {tokens} tokens")
    assert total <= FLOP_UNITS * 2 * parameters * tokens, (total, parameters, tokens)


def test_the_policy_trains_in_fp32_and_the_lm_head_projects_in_bf16(trainer):
    """The dtype audit: fp32 master weights (they moved in the step above or not, they stay
    fp32), reference linears bf16, and no fp32 logits: every projection onto the vocabulary
    runs in bf16 under autocast."""
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    reference = trainer.accelerator.unwrap_model(trainer.ref_model)
    linears = [m for m in reference.modules() if isinstance(m, torch.nn.Linear)]
    tied = reference.lm_head.weight is reference.model.embed_tokens.weight
    assert {m.weight.dtype for m in linears if m is not reference.lm_head} == {torch.bfloat16}
    assert reference.lm_head.weight.dtype == (torch.float32 if tied else torch.bfloat16)
    vocabulary = trainer.model.config.vocab_size
    ids = torch.randint(vocabulary, (MICRO, 40))
    mask = torch.ones_like(ids)
    with VocabularyProjections(vocabulary) as projections:
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 8)
        logps.sum().backward()
    trainer.model.zero_grad()
    assert projections.dtypes == {torch.bfloat16}


class VocabularyProjections(TorchDispatchMode):
    """The dtypes of matrix products whose output is as wide as the vocabulary (logits)."""

    def __init__(self, vocabulary: int):
        super().__init__()
        self.vocabulary, self.dtypes = vocabulary, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        products = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.mm.out)
        if func in products and out.dim() == 2 and out.size(-1) == self.vocabulary:
            self.dtypes.add(out.dtype)
        return out


class WeightCasts(TorchDispatchMode):
    """Copies made of the given weights (autocast's casts), in all and of how many weights."""

    def __init__(self, weights):
        super().__init__()
        self.storages = {w.untyped_storage().data_ptr() for w in weights}
        self.count, self.cast = 0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            storage = args[0].untyped_storage().data_ptr()
            if storage in self.storages:
                self.count += 1
                self.cast.add(storage)
        return func(*args, **(kwargs or {}))


def test_generation_casts_each_weight_once_not_once_per_token(trainer, monkeypatch):
    """accelerate wraps each forward of the fp32 policy in an autocast of its own, so TRL's
    generation casts every weight again at every decoding step; grail's runs inside one
    autocast: each weight cast once per generation, and the same completions (the casts are
    the same, so the logits and the seeded samples are)."""
    assert trainer.accelerator.native_amp  # bf16 mixed precision over fp32 weights
    # as trainer.train() does first (accelerate prepares a model once): the autocast wrapper
    trainer.accelerator.prepare_model(trainer.model)
    monkeypatch.setattr(trainer.generation_config, "min_new_tokens", 4)  # >= 4 forwards
    policy = trainer.accelerator.unwrap_model(trainer.model)
    weights = [w for w in policy.parameters() if w.dtype == torch.float32]
    tokenizer = trainer.processing_class
    prompts = [tokenizer(text)["input_ids"] for text in ("Which video next?", "Pick one: 1, 2")]
    results = {}
    for name, generate in (("trl", GRPOTrainer._generate_single_turn), ("grail", None)):
        generate = generate or type(trainer)._generate_single_turn
        torch.manual_seed(3)
        with WeightCasts(weights) as casts:
            completions, _ = generate(trainer, prompts, None, {}, 2)
        results[name] = completions, casts.count, len(casts.cast)
    (trls, trl_casts, trl_weights), (grails, grail_casts, grail_weights) = results.values()
    assert grails == trls
    assert grail_weights == trl_weights > 0  # every linear weight, by autocast either way
    assert grail_casts == grail_weights  # each once
    assert trl_casts >= 4 * trl_weights  # each once per decoding step


def test_padding_is_cut_per_chunk_with_the_same_log_probs_and_fewer_flops(trainer):
    """Each chunk is cut to its own padding: the same log-probabilities as TRL's padded
    forward, for fewer FLOPs (the other rows of the generation batch set TRL's width)."""
    torch.manual_seed(1)
    vocabulary = trainer.model.config.vocab_size
    ids = torch.randint(3, vocabulary, (2 * MICRO, 30))
    mask = torch.ones_like(ids)
    mask[:MICRO, :12] = 0  # the first chunk's prompts are 12 tokens shorter
    mask[:, -3:] = 0  # every completion ends 3 tokens before the batch's width
    mask[-1, -6:] = 0
    with torch.no_grad():
        with FlopCounterMode(display=False) as padded_flops:
            padded, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
                trainer, trainer.model, ids, mask, 10, batch_size=MICRO
            )
        with FlopCounterMode(display=False) as cut_flops:
            cut, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, 10, batch_size=MICRO
            )
    assert cut.shape == padded.shape
    scored = mask[:, -10:].bool()
    # RoPE is relative: positions shifted by the cut padding change bf16 rounding, not the math
    torch.testing.assert_close(cut[scored], padded[scored], rtol=1e-2, atol=1e-3)
    assert torch.all(cut[~scored] == 0)
    assert cut_flops.get_total_flops() < 0.8 * padded_flops.get_total_flops()


def _grouped_chunk(keep: int, lengths: list[list[int]]):
    """Rows of left-padded prompts (one per group, repeated per completion, as TRL's sampler
    lays them out) and right-padded completions of the given lengths."""
    torch.manual_seed(2)
    prompts = [torch.randint(3, 101, (9 - 4 * g,)) for g in range(len(lengths))]
    ids, mask = [], []
    for prompt, group in zip(prompts, lengths, strict=True):
        for n in group:
            padding = torch.zeros(9 - prompt.numel(), dtype=torch.long)
            ids.append(torch.cat([padding, prompt, torch.randint(3, 101, (keep,))]))
            used = torch.cat([torch.arange(9) >= padding.numel(), torch.arange(keep) < n])
            mask.append(used.long())
    return torch.stack(ids), torch.stack(mask)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_group_prompts_packed_give_the_same_log_probs_entropies_and_gradients(attention):
    """Each group's prompt read once (a 4-D mask, positions continuing from the prompt) scores
    every completion token as the padded rows do, entropies and gradients included, for
    fewer tokens; an empty completion stays 0; no shared prompt, nothing packed."""
    model = _tiny_qwen(tied=True)
    model.config._attn_implementation = attention
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    keep = 7
    ids, mask = _grouped_chunk(keep, [[2, 7, 5], [7, 4, 0]])
    order = torch.tensor([3, 0, 5, 1, 4, 2])  # TRL shuffles a generation batch's rows
    ids, mask = ids[order], mask[order]
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    padded = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    padded.log_probs[:, -keep:].sum().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    packed = pack_groups(ids, mask, keep, attention)
    assert packed.tokens < 0.7 * int(mask.sum())
    outputs = model(**packed.model_inputs(), fused_lm_head=True)
    logps = packed.unpack(outputs.log_probs)
    torch.testing.assert_close(logps, padded.log_probs[:, -keep:])
    torch.testing.assert_close(packed.unpack(outputs.entropy), padded.entropy[:, -keep:])
    assert torch.all(logps[2] == 0) and torch.all(logps[1, 2:] == 0)  # the empty, the 2-token
    logps.sum().backward()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.grad, expected[name], msg=name)
    distinct, _ = _grouped_chunk(keep, [[3], [4]])
    assert pack_groups(distinct, torch.ones_like(distinct), keep) is None


def test_packing_skips_empty_groups_refuses_unknown_layouts_and_weighs_attention():
    """A group whose completions are all empty is left out (its rows score 0) while the
    others pack; a completion mask with a hole is not packed; a group whose packed row would
    cost more attention than its rows save is sent as rows."""
    keep = 7
    ids, mask = _grouped_chunk(keep, [[0, 0], [3, 5]])
    packed = pack_groups(ids, mask, keep)
    assert packed.input_ids.size(0) == 1 and set(packed.rows.tolist()) == {2, 3}
    holed = mask.clone()
    holed[2, -keep + 1] = 0  # the second completion token masked, the third not
    assert pack_groups(ids, holed, keep) is None
    assert pack_groups(ids, mask, keep, pair_cost=1.0) is None  # attention dear: rows alone


def _segments(prompt: int, replies: list[int], width: int) -> torch.Tensor:
    """One packed row's segments (0: the prompt, k: the k-th reply, -1: padding)."""
    parts = [torch.zeros(prompt)] + [torch.full((n,), k) for k, n in enumerate(replies, 1)]
    row = torch.cat(parts).long()
    return torch.cat([row, torch.full((width - row.numel(),), -1)])


def test_the_block_mask_allows_exactly_the_dense_masks_pairs_and_skips_other_blocks():
    """sdpa_flex's block mask is the dense mask's rule, pair for pair (padding included), and a
    packed group of long completions leaves most blocks out: FlexAttention skips the pairs
    between two completions that SDPA's dense mask makes it score."""
    segment = torch.stack([_segments(3, [4, 1, 5], 16), _segments(2, [2, 6], 16)])
    block = segment_block_mask(segment)
    batch = torch.arange(2)[:, None, None]
    query, key = torch.arange(16)[None, :, None], torch.arange(16)[None, None, :]
    allowed = block.mask_mod(batch, 0, query, key)
    assert torch.equal(allowed, segment_mask(segment)[:, 0])
    assert torch.equal(segment_mask(segment, "eager")[:, 0] == 0, allowed)
    assert isinstance(segment_mask(segment, "sdpa_flex"), type(block))
    long = _segments(512, [1024] * 8, 8704)[None]  # 68 blocks of 128 a side
    used = segment_block_mask(long)
    blocks = int(used.kv_num_blocks.sum() + used.full_kv_num_blocks.sum())
    assert blocks < 0.3 * (68 * 69 // 2)  # of a causal mask's
    assert worth_packing(512, [1024] * 8, 6.6e-5, sparse=True)
    assert not worth_packing(512, [1024] * 8, 6.6e-5)


def test_packing_under_sdpa_flex_refuses_to_train_without_a_gpu():
    """torch has no FlexAttention backward on CPU: a run that would train packed groups under
    sdpa_flex there stops with one line; rows alone, or a GPU, may."""
    with pytest.raises(GrailError, match="needs a CUDA GPU"):
        check_trainable("sdpa_flex", share_group_prompts=True, cpu=True)
    check_trainable("sdpa_flex", share_group_prompts=False, cpu=True)
    check_trainable("sdpa_flex", share_group_prompts=True, cpu=False)
    check_trainable("sdpa", share_group_prompts=True, cpu=True)


def _sdpa_and_sdpa_flex() -> tuple[Qwen2ForCausalLM, Qwen2ForCausalLM]:
    """One tiny random model twice, under SDPA and under sdpa_flex, with 3 query heads per
    key/value head (6 in Qwen2.5-1.5B: not a power of 2 either)."""
    sdpa = _tiny_qwen(tied=False, hidden_size=48, heads=6)
    # a config of its own: transformers sets the implementation on the config it is given
    config = copy.deepcopy(sdpa.config)
    flex = Qwen2ForCausalLM._from_config(config, attn_implementation="sdpa_flex")
    flex.eval().load_state_dict(sdpa.state_dict())
    implementations = (sdpa.config._attn_implementation, flex.config._attn_implementation)
    assert implementations == ("sdpa", "sdpa_flex")
    return sdpa, flex


@pytest.mark.parametrize("autocast", [False, True])
def test_sdpa_flex_decodes_from_the_cache_as_it_is_without_copying_it_per_query_head(autocast):
    """sdpa_flex's decoding step (:func:`grail.train.attention.grouped_decoding`): each
    key/value head's query heads attend as the query rows of one SDPA call, where transformers'
    SDPA function copies the keys and values once per query head (``repeat_kv``, at every step
    of a left-padded batch). Greedy generation from a left-padded batch gives transformers'
    completions, its logits equal up to rounding (fp32, and under bf16 autocast); ``repeat_kv``
    runs in the prefill only (2 layers x keys and values), not at each of the 5 steps."""
    from transformers import GenerationConfig
    from transformers.integrations import sdpa_attention

    sdpa, flex = _sdpa_and_sdpa_flex()
    ids = torch.randint(1, 101, (3, 7))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a left-padded prompt: transformers' decoding steps get a mask
    generation = GenerationConfig(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=0)
    generation.output_logits = generation.return_dict_in_generate = True
    copies, repeat = Counter(), sdpa_attention.repeat_kv

    def counted(states, groups):
        copies[model.config._attn_implementation] += 1
        return repeat(states, groups)

    outputs = {}
    with (
        pytest.MonkeyPatch.context() as patch,
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
    ):
        patch.setattr(sdpa_attention, "repeat_kv", counted)
        for model in (sdpa, flex):
            outputs[model] = model.generate(
                input_ids=ids, attention_mask=mask, generation_config=generation
            )
    theirs, ours = outputs[sdpa], outputs[flex]
    assert torch.equal(ours.sequences, theirs.sequences)
    tolerance = dict(rtol=0, atol=2e-2) if autocast else {}
    for step, logits in enumerate(ours.logits):
        torch.testing.assert_close(logits, theirs.logits[step], **tolerance)
    assert copies == {"sdpa": 2 * 2 * 6, "sdpa_flex": 2 * 2}, copies


@pytest.mark.integration
def test_sdpa_flex_scores_packed_groups_as_sdpa_scores_rows_compiled_once():
    """A model loaded with attn_implementation sdpa_flex: rows (a 2-D mask) are transformers'
    SDPA, bit for bit; packed groups of every width (a block mask) give the rows' log-probs
    and entropies through FlexAttention compiled once (no recompile per width, no fallback to
    the unfused kernel), and under bf16 autocast too (q and k fp32 after RoPE, v bf16).
    Forward only: torch has no FlexAttention backward on CPU."""
    from torch._dynamo.utils import counters

    sdpa, flex = _sdpa_and_sdpa_flex()
    for model in (sdpa, flex):
        add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    compiled = counters["stats"]["unique_graphs"]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*without torch.compile.*")
        for keep in (7, 12, 33, 58, 90):
            ids, mask = _grouped_chunk(keep, [[2, keep, 5], [keep, 4, 0]])
            labels = ids.masked_fill(mask == 0, -100)
            labels[:, :-keep] = -100
            rows = sdpa(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
            same = flex(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
            assert torch.equal(rows.log_probs, same.log_probs)
            packed = pack_groups(ids, mask, keep, "sdpa_flex")
            outputs = flex(**packed.model_inputs(), fused_lm_head=True)
            expected = rows.log_probs[:, -keep:]
            torch.testing.assert_close(packed.unpack(outputs.log_probs), expected)
            torch.testing.assert_close(packed.unpack(outputs.entropy), rows.entropy[:, -keep:])
    assert counters["stats"]["unique_graphs"] - compiled <= 2
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # the recipes' precision
        rows = sdpa(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        outputs = flex(**packed.model_inputs(), fused_lm_head=True)
    torch.testing.assert_close(
        packed.unpack(outputs.log_probs), rows.log_probs[:, -keep:], rtol=0.02, atol=0.05
    )


def test_only_models_that_score_a_packed_group_exactly_share_prompts():
    """Packing needs a 4-D mask taken as given (SDPA, eager), relative positions (RoPE) and
    full attention in every layer; the pair cost is Qwen2.5-1.5B's, by its shape."""
    config = _tiny_qwen(tied=True).config
    for attention, shares in [
        ("sdpa", True),
        ("eager", True),
        ("sdpa_flex", True),
        ("flash_attention_2", False),
        ("flex_attention", False),  # not offered: untested, and generation would run through it
    ]:
        config._attn_implementation = attention
        assert shares_prompts_exactly(config) is shares
    config._attn_implementation = "sdpa"
    sliding = copy.deepcopy(config)
    sliding.layer_types = ["sliding_attention", "full_attention"]
    assert not shares_prompts_exactly(sliding)
    qwen = Qwen2Config(
        hidden_size=1536,
        intermediate_size=8960,
        num_attention_heads=12,
        num_key_value_heads=2,
    )
    assert attention_pair_cost(qwen) == pytest.approx(2 * 12 * 128 / 46_792_704)


def test_training_micro_batches_hold_whole_groups(trainer, monkeypatch):
    """TRL's _prepare_inputs splits a generation batch into micro-batches after its shuffle:
    grail's shuffles by group, so every micro-batch holds whole groups, with every row once."""
    rows = MICRO * GA * 2  # groups of 2 (the fixture's num_generations)
    prompts = torch.arange(rows).div(2, rounding_mode="floor")[:, None].repeat(1, 3)
    batch = {
        "prompt_ids": prompts,
        "prompt_mask": torch.ones_like(prompts),
        "completion_ids": torch.arange(rows)[:, None],
        "completion_mask": torch.ones(rows, 1, dtype=torch.long),
        "advantages": torch.arange(rows, dtype=torch.float),
    }
    monkeypatch.setattr(trainer, "_generate_and_score_completions", lambda inputs: batch)
    monkeypatch.setattr(trainer.args, "steps_per_generation", 2)
    saved = trainer._step, trainer._buffered_inputs
    trainer.model.train()
    try:
        for seed in range(3):
            torch.manual_seed(seed)
            trainer._buffered_inputs, seen = None, []
            for step in range(2):
                trainer._step = step
                micro = trainer._prepare_inputs([{}] * rows)
                ids = micro["completion_ids"].flatten().tolist()
                assert set(Counter(i // 2 for i in ids).values()) == {2}  # whole groups
                seen += ids
            assert sorted(seen) == list(range(rows))
    finally:
        trainer._step, trainer._buffered_inputs = saved
        trainer.model.eval()


def test_a_generation_batch_is_shuffled_by_group():
    """Every row once, each group's rows together, tensors and lists moved alike, the groups'
    order random."""
    prompts = torch.tensor([[1, 1], [1, 1], [2, 2], [2, 2], [3, 3], [3, 3], [4, 4], [4, 4]])
    batch = {
        "prompt_ids": prompts,
        "prompt_mask": torch.ones_like(prompts),
        "advantages": torch.arange(8.0),
        "names": [f"row {i}" for i in range(8)],
        "num_items_in_batch": torch.tensor(8),
        "images": None,
    }
    orders = set()
    for seed in range(6):
        torch.manual_seed(seed)
        shuffled = shuffle_groups(batch)
        rows = shuffled["advantages"].long().tolist()
        assert sorted(rows) == list(range(8))
        assert shuffled["names"] == [f"row {i}" for i in rows]
        assert torch.equal(shuffled["prompt_ids"], prompts[rows])
        assert all(rows[i] // 2 == rows[i + 1] // 2 for i in range(0, 8, 2))
        assert shuffled["num_items_in_batch"] == 8 and shuffled["images"] is None
        orders.add(tuple(rows))
    assert len(orders) > 1


def test_the_trainer_packs_group_prompts_unless_the_recipe_says_no(trainer):
    """The trainer's scoring of a chunk of groups: TRL's log-probabilities, fewer FLOPs;
    ``share_group_prompts: false`` sends every row whole."""
    keep = 7
    ids, mask = _grouped_chunk(keep, [[2, 7], [7, 4]])
    with torch.no_grad():
        with FlopCounterMode(display=False) as trl_flops:
            trls, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
                trainer, trainer.model, ids, mask, keep, batch_size=MICRO
            )
        with FlopCounterMode(display=False) as packed_flops:
            packed, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, keep, batch_size=MICRO
            )
        trainer.args.share_group_prompts = False
        try:
            with FlopCounterMode(display=False) as whole_flops:
                trainer._get_per_token_logps_and_entropies(
                    trainer.model, ids, mask, keep, batch_size=MICRO
                )
        finally:
            trainer.args.share_group_prompts = True
    torch.testing.assert_close(packed, trls, rtol=1e-2, atol=1e-3)  # bf16 autocast
    assert packed_flops.get_total_flops() < 0.8 * whole_flops.get_total_flops()
    assert whole_flops.get_total_flops() <= trl_flops.get_total_flops()


def test_vllm_ratio_is_trls_formula_on_the_training_forwards_log_probs(trainer):
    """The importance ratio grail computes in the loss (no second policy forward) is TRL's:
    exp of the masked log-prob difference, per token or per sequence, clipped or masked."""
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.1, -3.0]])
    sampling = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, float("nan"), -2.0]])
    inputs = {"completion_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}
    difference = torch.tensor([[0.5, -1.0, 0.0], [0.0, 0.0, 0.0]])
    trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max = 0.5, 1.5
    cases = {
        "token_truncate": torch.exp(difference).clamp(0.5, 1.5),
        "token_mask": torch.exp(difference)
        .masked_fill(torch.exp(difference) > 1.5, 0.0)
        .masked_fill(torch.exp(difference) < 0.5, 0.0),
        "sequence_truncate": torch.exp(difference.sum(-1, keepdim=True)).clamp(0.5, 1.5),
    }
    try:
        for mode, expected in cases.items():
            trainer.vllm_importance_sampling_mode = mode
            torch.testing.assert_close(trainer.sampling_ratio(logps, sampling, inputs), expected)
    finally:
        trainer.vllm_importance_sampling_mode = trainer.args.vllm_importance_sampling_mode


def test_continuous_batching_is_refused_where_it_would_cast_the_fp32_masters(
    small_clean, tiny_policy, tmp_path
):
    args = tiny_args(small_clean, tiny_policy, tmp_path / "out")
    with pytest.raises(GrailError, match="use_transformers_continuous_batching: TRL casts"):
        parse_train_args([*args, "--use_transformers_continuous_batching", "true", "--bf16", "1"])
    parse_train_args(args + ["--use_transformers_continuous_batching", "true"])  # fp32: fine


# Qwen2.5-1.5B-Instruct's shape (1.54B parameters with its 151,936-token vocabulary)
QWEN_15B = Shape(parameters=1_543_714_304, layers=28, hidden=1536, intermediate=8960, kv_width=256)


def test_memory_estimate_turns_checkpointing_on_only_where_activations_would_not_fit(
    small_clean, tiny_policy, tmp_path
):
    """The shipped 1.5B recipe (micro-batches of 16 x 480-token prompts): with vLLM colocated
    at 0.3 of an 80 GB H100 it needs checkpointing, on a 141 GB H200 it does not; without vLLM
    the H100 needs it for 256-token completions, not for 16-token ones."""
    recipe = "recipes/Qwen2.5-1.5B-Instruct/grpo/config_grpo_gun.yaml"
    config, _ = parse_train_args(
        ["--config", recipe, "--dataset", str(small_clean), "--output_dir", str(tmp_path)]
        + ["--use_cpu", "true"]  # parsed here without a GPU; the estimate takes the GPU's size
    )
    h100, h200 = 80 * 10**9, 141 * 10**9
    with_vllm = plan(QWEN_15B, config, 480, h100)
    assert with_vllm.checkpointing and "gradient_checkpointing on" in with_vllm.describe()
    assert with_vllm.total(True) < 0.85 * h100  # and with it, it fits
    assert not plan(QWEN_15B, config, 480, h200).checkpointing
    config.use_vllm = False
    alone = plan(QWEN_15B, config, 480, h100)
    assert alone.checkpointing and alone.vllm == 0 and alone.generation > 0
    config.max_completion_length = 16
    assert not plan(QWEN_15B, config, 480, h100).checkpointing
    config.compile_generation = True  # the static cache is kept while training: added, not max
    kept = plan(QWEN_15B, config, 480, h100)
    assert kept.total(False) == plan_without_cache(kept) + kept.generation + kept.activations_off
    assert "(its static cache, kept) + (activations" in kept.describe()
    per_token = activation_bytes_per_token(QWEN_15B, False)
    assert 3e6 < per_token < 4e6  # ~3.4 MB a token without checkpointing, all 28 layers
    assert activation_bytes_per_token(QWEN_15B, True) < per_token / 10


def plan_without_cache(estimate) -> int:
    return estimate.states + estimate.reference + estimate.vllm


def test_the_longest_prompt_is_counted_in_tokens_with_the_chat_template(tiny_policy, small_clean):
    """Chat prompts counted as the trainer tokenizes them (transformers 5's tokenized chat
    template is a BatchEncoding: its len() is 2, the bug this guards)."""
    from transformers import AutoTokenizer

    from grail.train.memory import longest_prompt_tokens

    config, _ = parse_train_args(tiny_args(small_clean, tiny_policy, "/tmp/unused"))
    prompts = load_examples(config, "train", 64)["prompt"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    texts = [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
        for p in prompts
    ]
    expected = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    assert longest_prompt_tokens(str(tiny_policy), prompts) == expected > 20


@pytest.mark.integration
@pytest.mark.parametrize("attention", ["sdpa", "sdpa_flex"])
def test_compiled_generation_uses_one_static_cache_and_compiles_its_decoding_step_once(
    small_clean, tiny_policy, tmp_path, attention
):
    """compile_generation: TRL's generation config gets transformers' static cache, sized for
    the longest prompt plus max_completion_length, with compilation allowed (TRL 1.16 disables
    it). Over three steps, whose generation batches have prompts of different widths, every
    generation writes to one cache at one address (a CUDA graph holds its inputs' addresses;
    transformers alone builds a cache per call), each group's prompt prefilled once into it,
    and the decoding step compiles once.
    transformers compiles only on a GPU; the test lets it compile on CPU through CompileConfig
    (its own switch, unset in the product). Under ``sdpa_flex`` too (bench/gpu.py's 256-token
    candidate runs both): its generation is SDPA's, traced through grail's attention function
    (groups whole here: no FlexAttention backward on CPU). Under bf16 autocast over fp32
    weights, as the GPU recipes train: the cache holds bf16 keys and values (transformers'
    own static cache fails there: fp32 keys after RoPE, bf16 values)."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig, GenerationMixin

    config, model_config = parse_train_args(
        tiny_args(small_clean, tiny_policy, tmp_path)
        + ["--compile_generation", "true", "--max_steps", "3", "--save_strategy", "no"]
        + ["--bf16", "true"]
        + ["--attn_implementation", attention]
        + (["--share_group_prompts", "false"] if attention == "sdpa_flex" else [])
    )
    built, _ = build_trainer(config, model_config)
    assert built.model.config._attn_implementation == attention
    generation = built.generation_config
    assert generation.cache_implementation == "static" and not generation.disable_compile
    assert generation.max_cache_len > config.max_completion_length
    generation.compile_config = CompileConfig()
    generation.compile_config._compile_all_devices = True
    widths, caches, generate, prefilled = [], set(), GenerationMixin.generate, []
    dtypes = set()

    def recorded(model, *args, **kwargs):
        widths.append(kwargs["input_ids"].size(1))
        prefilled.append(int(kwargs["past_key_values"].get_seq_length()))
        out = generate(model, *args, **kwargs)
        cache = kwargs["past_key_values"].layers[0]  # the one cache, where its tensors are
        caches.add((cache.max_cache_len, cache.keys.data_ptr(), cache.values.data_ptr()))
        dtypes.add((cache.keys.dtype, cache.values.dtype))
        return out

    compiled = counters["stats"]["unique_graphs"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(GenerationMixin, "generate", recorded)
        built.train()
    assert built.state.global_step == 3 and len(set(widths)) > 1, widths
    assert built.accelerator.native_amp
    assert dtypes == {(torch.bfloat16, torch.bfloat16)}, dtypes
    assert len(caches) == 1 and next(iter(caches))[0] == generation.max_cache_len, caches
    assert 1 <= counters["stats"]["unique_graphs"] - compiled <= 2
    # each group's prompt prefilled once into the cache, but its last token (share_group_prompts)
    shared = [width - 1 for width in widths] if attention == "sdpa" else [0] * len(widths)
    assert prefilled == shared


@pytest.mark.parametrize("peft", [False, True])
def test_checkpointing_toggled_around_generation_leaves_one_input_hook(
    small_clean, tiny_policy, tmp_path, peft
):
    """TRL turns gradient checkpointing off and on around every generation without vLLM;
    transformers 5.17 adds an input-embedding hook each time it is turned on and removes none
    (on a full model, and on a LoRA model built by peft). After three steps the embeddings
    carry the one hook checkpointing needs."""
    config, model_config = parse_train_args(
        tiny_args(small_clean, tiny_policy, tmp_path)
        + ["--gradient_checkpointing", "true", "--max_steps", "3", "--save_strategy", "no"]
        + ["--use_peft", str(peft).lower()]
    )
    built, _ = build_trainer(config, model_config)
    built.train()
    embeddings = built.accelerator.unwrap_model(built.model).get_input_embeddings()
    assert built.state.global_step == 3
    assert len(embeddings._forward_hooks) == 1


@pytest.mark.parametrize("share_prompts", [False, True])
def test_a_reused_static_cache_generates_what_a_fresh_one_does(share_prompts):
    """compile_generation's generate (:class:`ReusedStaticCache`): batches of other prompt
    widths, one after another, write to one cache at one address, reset between calls, and
    their greedy completions are those of transformers' own fresh static cache; a batch of
    another size, or one that needs more positions than the cache holds, gets a new one. With
    share_group_prompts, a repeated prompt is prefilled once and its cache written to each of
    its rows in place."""
    from transformers import GenerationConfig

    from grail.train.generation import ReusedStaticCache

    torch.manual_seed(0)
    model = _tiny_qwen(tied=True)
    config = GenerationConfig(
        max_new_tokens=6, do_sample=False, cache_implementation="static", max_cache_len=24
    )
    config.pad_token_id = config.eos_token_id = 0
    reused, caches = ReusedStaticCache(model, share_prompts=share_prompts), []
    for rows, width in ((3, 9), (3, 5), (3, 12), (2, 7), (2, 21)):
        prompts = torch.randint(1, 101, (2, width))
        mask = torch.ones_like(prompts)
        mask[0, :2] = 0  # a left-padded prompt
        order = torch.arange(rows) % 2  # a third row repeats the first
        ids, mask = prompts[order], mask[order]
        fresh = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        positions = Positions(model)
        again = reused(input_ids=ids, attention_mask=mask, generation_config=config)
        positions.handle.remove()
        assert torch.equal(again, fresh), (rows, width)
        assert positions.shapes[0] == ((2, width - 1) if share_prompts else (rows, width))
        layer = reused.cache.layers[0]
        caches.append((layer.keys.size(0), layer.max_cache_len, layer.keys.data_ptr()))
    assert len(set(caches[:3])) == 1 and caches[0][:2] == (3, 24)
    assert caches[3][:2] == (2, 24) and caches[4][:2] == (2, 21 + 6 - 1)  # as transformers sizes
    assert config.cache_implementation == "static"  # the caller's config is left as it was


def test_generation_caches_hold_keys_and_values_in_attention_s_dtype_under_autocast():
    """Under bf16 autocast over fp32 weights (the GPU recipes' training), RoPE turns the keys
    fp32 and transformers allocates a cache in the keys' dtype: its static cache refuses the
    bf16 values (compile_generation failed so on an H100), its dynamic one holds both in fp32.
    grail's caches hold both in bf16, what attention reads: the shared prefill's logits are
    bit-identical to transformers' own generation; the kept static cache's completions are
    the same and its logits the same up to bf16 rounding (its attention spans the whole
    cache)."""
    from transformers import GenerationConfig

    from grail.train.generation import ReusedStaticCache, SharedPrefill, shared_prefill

    model = _tiny_qwen(tied=True)
    prompts = torch.randint(1, 101, (2, 9))
    ids, mask = prompts[[0, 1, 0, 1]], torch.ones(4, 9, dtype=torch.long)
    mask[[0, 2], :2] = 0  # a left-padded prompt
    inputs = {"input_ids": ids, "attention_mask": mask}
    settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=0)
    scored = dict(settings, output_logits=True, return_dict_in_generate=True)
    static = GenerationConfig(**scored, cache_implementation="static", max_cache_len=24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="same dtype"):  # transformers' own static cache
            model.generate(**inputs, generation_config=static)
        own = model.generate(**inputs, generation_config=GenerationConfig(**scored))
        cache, _ = shared_prefill(model, GenerationConfig(**settings), inputs)
        shared = SharedPrefill(model)(**inputs, generation_config=GenerationConfig(**scored))
        reused = ReusedStaticCache(model)
        kept = reused(**inputs, generation_config=static)
    held = {(layer.keys.dtype, layer.values.dtype) for layer in cache.layers}
    held |= {(layer.keys.dtype, layer.values.dtype) for layer in reused.cache.layers}
    assert held == {(torch.bfloat16, torch.bfloat16)}
    assert torch.equal(shared.sequences, own.sequences)
    assert all(map(torch.equal, shared.logits, own.logits))
    assert torch.equal(kept.sequences, own.sequences)
    for theirs, ours in zip(own.logits, kept.logits, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-2)


class Positions:
    """The positions each forward of a model reads (rows x columns)."""

    def __init__(self, model):
        self.shapes = []
        self.handle = model.register_forward_pre_hook(self.count, with_kwargs=True)

    def count(self, module, args, kwargs):
        self.shapes.append(tuple(kwargs["input_ids"].shape))

    def total(self) -> int:
        return sum(rows * columns for rows, columns in self.shapes)


@pytest.mark.parametrize("lora", [False, True])
def test_each_distinct_prompt_is_prefilled_once_with_the_same_completions(lora):
    """share_group_prompts in generation (:class:`SharedPrefill`): a batch of three prompts,
    each repeated, one left-padded, in no order, prefills each prompt once (but its last token)
    and decodes from copies of its cache: the same greedy and seeded completions as
    transformers' own generate, with fewer positions read."""
    from peft import LoraConfig, get_peft_model
    from transformers import GenerationConfig

    from grail.train.generation import SharedPrefill

    model = decoder = _tiny_qwen(tied=True)
    if lora:
        model = get_peft_model(decoder, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    prompts = torch.randint(1, 101, (3, 9))
    mask = torch.ones_like(prompts)
    prompts[1, :3], mask[1, :3] = 0, 0
    rows = torch.tensor([0, 0, 1, 2, 1, 0, 2, 1])
    ids, mask = prompts[rows], mask[rows]
    for sample in (False, True):
        config = GenerationConfig(max_new_tokens=6, do_sample=sample, top_k=0)
        config.pad_token_id, config.eos_token_id = 0, 100
        results = []
        for generate in (model.generate, SharedPrefill(model)):
            positions = Positions(decoder)
            torch.manual_seed(5)
            results.append(
                (generate(input_ids=ids, attention_mask=mask, generation_config=config), positions)
            )
            positions.handle.remove()
        (own, own_positions), (shared, shared_positions) = results
        assert torch.equal(shared, own), sample
        assert own_positions.shapes[0] == (8, 9)  # every row's prompt
        assert shared_positions.shapes[:2] == [(3, 8), (8, 1)]  # once each, then last tokens
        assert shared_positions.total() == own_positions.total() - 8 * 9 + 3 * 8 + 8


def test_a_generation_with_its_own_cache_or_several_sequences_is_transformers_own():
    """:class:`SharedPrefill` hands a batch to transformers' generate as it came when the config
    names a cache implementation or asks for several sequences per prompt, and prefills a batch
    with no repeated prompt as any other (every ZeRO-3 process runs the same forwards);
    :func:`training_generate` puts it on the policy only without vLLM and without
    compile_generation (its kept static cache instead), and only with share_group_prompts."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    from grail.train.generation import ReusedStaticCache, SharedPrefill, training_generate

    model = _tiny_qwen(tied=True)
    distinct = torch.randint(1, 101, (3, 7))
    repeated = distinct[[0, 0, 1]]
    cases = (
        (distinct, {}, (3, 6)),
        (repeated, {"cache_implementation": "static", "max_cache_len": 16}, (3, 7)),
        (repeated, {"num_return_sequences": 2, "do_sample": True}, (6, 7)),
    )
    for ids, fields, prefilled in cases:
        config = GenerationConfig(max_new_tokens=3, pad_token_id=0, eos_token_id=100, **fields)
        positions = Positions(model)
        mask = torch.ones_like(ids)
        torch.manual_seed(0)
        shared = SharedPrefill(model)(input_ids=ids, attention_mask=mask, generation_config=config)
        positions.handle.remove()
        assert positions.shapes[0] == prefilled, fields
        torch.manual_seed(0)
        own = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        assert torch.equal(shared, own), fields

    def chosen(**fields):
        settings = {"use_vllm": False, "compile_generation": False, "share_group_prompts": True}
        generate = training_generate(model, SimpleNamespace(**{**settings, **fields}))
        return type(generate)

    assert chosen() is SharedPrefill
    assert chosen(compile_generation=True) is ReusedStaticCache
    assert chosen(share_group_prompts=False) is type(None)
    assert chosen(use_vllm=True, compile_generation=True) is type(None)


def test_the_trainer_prefills_each_group_s_prompt_once_with_trls_completions(trainer):
    """Training's generation without vLLM (TRL's, the policy under accelerate's bf16 autocast
    wrapper): each group's prompt prefilled once, and the same seeded completions as the
    model's own generate."""
    from grail.train.generation import SharedPrefill

    trainer.accelerator.prepare_model(trainer.model)  # as trainer.train() does first
    shared = trainer.model.__dict__["generate"]
    assert isinstance(shared, SharedPrefill)
    tokenizer = trainer.processing_class
    texts = ("Which video next?", "Pick one: 1, 2", "A longer prompt, with words in it")
    prompts = [tokenizer(text)["input_ids"] for text in texts for _ in range(4)]  # groups of 4
    policy = trainer.accelerator.unwrap_model(trainer.model)
    try:
        for seed in range(3):
            results = []
            for generate in (None, shared):
                trainer.model.__dict__.pop("generate")
                if generate is not None:
                    trainer.model.generate = generate
                positions = Positions(policy)
                torch.manual_seed(seed)
                completions, _ = trainer._generate_single_turn(prompts, None, {}, 4)
                positions.handle.remove()
                results.append((completions, positions.shapes[0]))
                trainer.model.generate = shared
            (own, own_prefill), (grails, grail_prefill) = results
            assert grails == own
            width = max(len(p) for p in prompts)
            assert own_prefill == (12, width) and grail_prefill == (3, width - 1)
    finally:
        trainer.model.generate = shared
