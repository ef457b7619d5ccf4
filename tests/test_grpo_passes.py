"""What one GRPO optimizer step costs, guarded on CPU (grail.train.grpo, grail.train.memory):
forwards counted per pass, a FLOP budget, a dtype audit, the vLLM importance ratio from the
training forward, the memory estimate, and the refusal of TRL's continuous batching."""

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
    shuffle_groups,
    trimmed,
    worth_packing,
)
from grail.train.memory import Shape, activation_bytes_per_token, plan
from grail.train.overrides import shares_prompts_exactly
from grail.train.trainer import build_trainer

GA = 2  # micro-batches per optimizer step
MICRO = 4  # completions per micro-batch: 2 prompts x 2
# one optimizer step's FLOPs per token (prompt and completion), in units of 2N (N: all parameters):
# generation (1), the policy's training forward (1) and backward (2), the reference's forward (1)
# make 5, less the LM head at prompt positions (it scores completions only), which is much of a
# tiny model's N: measured 3.1 with every completion's row carrying its prompt, 2.14 with each
# group's prompt read once by the scoring forwards (share_group_prompts; generation, TRL's,
# prefills every copy of a prompt). A pass over padding, an extra forward or prompts read per
# completion again in scoring moves it past 2.3.
FLOP_UNITS = 2.3


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
    """The shipped 1.5B recipe (micro-batches of 16 x 480-token prompts, packed by group): at
    its vLLM share (0.12 of an 80 GB H100) it needs no checkpointing; at 0.3 it did, and on a
    141 GB H200 it does not; with vLLM asleep while training, only the larger of vLLM's share
    and the activations counts; unpacked, the H100 needs it for 256-token completions with or
    without vLLM, not for 16-token ones."""
    recipe = "recipes/Qwen2.5-1.5B-Instruct/grpo/config_grpo_gun.yaml"
    config, _ = parse_train_args(
        ["--config", recipe, "--dataset", str(small_clean), "--output_dir", str(tmp_path)]
        + ["--use_cpu", "true"]  # parsed here without a GPU; the estimate takes the GPU's size
    )
    h100, h200 = 80 * 10**9, 141 * 10**9
    assert not plan(QWEN_15B, config, 480, h100).checkpointing
    config.vllm_gpu_memory_utilization = 0.3
    with_vllm = plan(QWEN_15B, config, 480, h100)
    assert with_vllm.checkpointing and "gradient_checkpointing on" in with_vllm.describe()
    assert with_vllm.total(True) < 0.85 * h100  # and with it, it fits
    assert not plan(QWEN_15B, config, 480, h200).checkpointing
    config.vllm_enable_sleep_mode = True
    asleep = plan(QWEN_15B, config, 480, h100)
    assert not asleep.checkpointing and "(asleep while training)" in asleep.describe()
    larger = max(asleep.vllm, asleep.activations_off)  # vLLM's 24 GB, here
    assert asleep.total(False) == asleep.states + asleep.reference + larger
    config.vllm_enable_sleep_mode = False
    config.share_group_prompts = False  # each completion's row carries its prompt
    unpacked = plan(QWEN_15B, config, 480, h100)
    ratio = unpacked.activations_off / with_vllm.activations_off
    assert 2.2 < ratio < 2.4  # 16 x 736 tokens against 2 x 480 + 16 x 256
    config.use_vllm = False
    assert plan(QWEN_15B, config, 480, h100).checkpointing  # unpacked 256-token completions
    config.share_group_prompts = True
    alone = plan(QWEN_15B, config, 480, h100)
    assert not alone.checkpointing and alone.vllm == 0 and alone.generation > 0
    config.share_group_prompts = False
    config.max_completion_length = 16
    assert not plan(QWEN_15B, config, 480, h100).checkpointing
    per_token = activation_bytes_per_token(QWEN_15B, False)
    assert 3e6 < per_token < 4e6  # ~3.4 MB a token without checkpointing, all 28 layers
    assert activation_bytes_per_token(QWEN_15B, True) < per_token / 10


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


# The longest prompt each GPU recipe is sized for (tokens, its chat template included): the
# slate prompts of history_depth up to 1.5k, the summarize prompt a RepLiQA document (~2k)
GPU_RECIPES = {
    **{
        f"recipes/Qwen2.5-1.5B-Instruct/grpo/config_{a}_{i}.yaml": (QWEN_15B, 1500)
        for a in ("grpo", "grail")
        for i in ("gun", "wage")
    },
    "recipes/Qwen2.5-3B-Instruct/summarize/config_grpo.yaml": (
        Shape(parameters=3_085_938_688, layers=36, hidden=2048, intermediate=11008, kv_width=256),
        2000,
    ),
}


@pytest.mark.parametrize("recipe", sorted(GPU_RECIPES))
def test_each_gpu_recipe_gives_vllm_the_share_its_estimate_needs(recipe, small_clean, tmp_path):
    """vllm_gpu_memory_utilization is what grail.train.memory.vllm_share gives on an 80 GB
    H100 (bf16 weights, one generation batch's KV cache, VLLM_OVERHEAD), within 0.02: not
    less (vLLM would hold less than one generation batch) nor a share by habit."""
    from grail.train.memory import vllm_share

    config, _ = parse_train_args(
        ["--config", recipe, "--dataset", str(small_clean), "--output_dir", str(tmp_path)]
        + ["--use_cpu", "true"]
    )
    shape, prompt = GPU_RECIPES[recipe]
    needed = vllm_share(shape, config, prompt, 80 * 10**9)
    assert config.use_vllm and config.vllm_mode == "colocate"
    assert needed <= config.vllm_gpu_memory_utilization <= needed + 0.02, needed
