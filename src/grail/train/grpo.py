"""The passes that make TRL's ``GRPOTrainer`` cheaper, none changing what is learned; the
subclass that runs them, overriding TRL's private methods, is
:class:`grail.train.overrides.GrailGRPOTrainer` (every override of a library's private name is
in that module):

- **the reference model's linear weights in bf16** when training runs under bf16 autocast on
  one process (:func:`reference_linears_in_bf16`): autocast casts every linear weight to bf16
  on every forward anyway, so its log-probabilities are bit-identical and it holds 2 bytes a
  parameter instead of 4 (embeddings and norms keep their dtype: they feed the residual stream);
- **each forward chunk cut to its own padding** (:func:`trimmed`): TRL pads prompts to the
  longest of the whole generation batch and completions to the longest completion, then runs
  the policy and reference over micro-batches of that width; columns that are padding in every
  row of a chunk are dropped before the forward (the log-probabilities are padded back, so
  every tensor keeps TRL's shape);
- **no second policy forward under vLLM** when it is redundant (``_compute_loss`` of
  :class:`grail.train.overrides.GrailGRPOTrainer`): TRL computes the "old" log-probs of
  every completion with a no-grad policy forward, only to divide by vLLM's sampling log-probs
  (its importance-sampling correction). When the whole generation batch trains before the next
  optimizer step (``steps_per_generation == gradient_accumulation_steps`` and one iteration)
  the policy has not moved, so those log-probs are the training forward's own, detached: the
  ratio is computed from them in the loss, with TRL's own modes and clips;
- **each group's prompt read once** (``share_group_prompts``): the completions of one prompt in
  a chunk are packed into one sequence after a single copy of their prompt
  (:func:`pack_groups`), each attending to the prompt and to itself alone (a 4-D mask,
  positions continuing from the prompt's), in the reference's, the old-log-prob and the
  policy's training forwards. TRL shuffles a generation batch's rows before it splits them
  into micro-batches; grail shuffles it by group (:func:`shuffle_groups`), so a training
  micro-batch holds whole groups. Only models that score a packed group as its rows
  (:func:`grail.train.overrides.shares_prompts_exactly`), and only groups whose packed row
  costs less (:func:`worth_packing`). The log-probabilities, entropies and gradients are the
  same up to rounding, not bit-identical (tests/test_grpo_passes.py). Under SDPA the mask is
  dense (no flash kernel; every pair of a packed row scored); ``attn_implementation:
  sdpa_flex`` (:mod:`grail.train.attention`) gives packed rows to FlexAttention as a block
  mask.

One fix, around generation without vLLM: ``one_input_grads_hook`` (:mod:`grail.train.overrides`:
a patch of transformers' public method, pinned) stops the
input-embedding hooks that TRL's checkpointing toggle piled up, one per step. Generation itself
is TRL's (the recipes generate with vLLM, which caches prompts and holds its own 16-bit weights).

One more override changes nothing TRL computes: ``_calculate_rewards`` tells each training
batch's gathered rewards to :class:`grail.train.rl_signal.RLSignal` (whether RL has signal).

Everything else is TRL's (pinned at 1.16, docs/pins.md#trl-116): the subclass overrides five
of its methods (one also wrapped for one call), and tests/test_grpo_passes.py counts the
forwards and FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.attention.flex_attention import BlockMask
from trl import GRPOTrainer

from grail.train.attention import SDPA_FLEX, segment_block_mask

MASKED_ATTENTION = ("sdpa", "eager", SDPA_FLEX)  # the attention a packed group's mask suits


@dataclass
class Packed:
    """A chunk packed by :func:`pack_groups`: one row per group of completions that share a
    prompt; ``rows``/``columns`` say where each scored token of ``shift_labels`` goes in the
    chunk's (rows x kept completion columns) layout, read at ``groups``/``positions``."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | BlockMask  # a block mask under sdpa_flex
    shift_labels: torch.Tensor
    shape: tuple[int, int]
    tokens: int  # what a forward reads, the packed rows' padding excluded
    rows: torch.Tensor
    columns: torch.Tensor
    groups: torch.Tensor
    positions: torch.Tensor

    def model_inputs(self) -> dict[str, torch.Tensor | BlockMask]:
        """What a causal LM's forward takes for the packed rows (TRL's fused head reads
        ``shift_labels`` as given, unshifted)."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "shift_labels": self.shift_labels,
        }

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """Per-token values of the packed rows in the chunk's layout (0 where nothing was
        scored, as TRL's fused head leaves padding)."""
        out = values.new_zeros(self.shape)
        return out.index_put((self.rows, self.columns), values[self.groups, self.positions])


def pack_groups(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    keep: int,
    attention: str = "sdpa",
    dtype: torch.dtype = torch.float32,
    pair_cost: float = 0.0,
) -> Packed | None:
    """Pack a chunk (rows of left-padded prompt, then `keep` right-padded completion columns)
    so the rows that share a prompt, wherever they are in the chunk, read it once.

    A packed sequence holds the prompt but its last token, then per row its last prompt token
    and its completion but the last token (the positions that predict the completion's tokens),
    positions continuing from the prompt's. Each completion attends to the shared prompt and to
    itself. A group is packed only where :func:`worth_packing` says so (its attention grows
    with the square of its length); rows with no completion are left out (they score 0).
    None when no group is worth packing, or a completion's mask is not a prefix (a layout this
    packing does not know).

    `attention`: the model's attention implementation, which says the mask's form
    (:func:`segment_mask`); `dtype`: an additive mask's. `pair_cost`: :func:`attention_pair_cost`.

    >>> ids = torch.tensor([[0, 5, 6, 7, 8], [9, 9, 9, 1, 0], [0, 5, 6, 3, 0]])
    >>> packed = pack_groups(ids, (ids > 0).long(), 2)  # rows 0 and 2 share the prompt 5 6
    >>> packed.input_ids.tolist(), packed.position_ids.tolist()
    ([[5, 6, 7, 6], [9, 9, 9, 0]], [[0, 1, 2, 1], [0, 1, 2, 0]])
    >>> packed.shift_labels.tolist()
    [[-100, 7, 8, 3], [-100, -100, 1, -100]]
    """
    device = input_ids.device  # packed on the CPU (a few thousand ids), then moved
    input_ids, attention_mask = input_ids.cpu(), attention_mask.cpu()
    prompt_width = input_ids.size(1) - keep
    lengths = attention_mask[:, prompt_width:].sum(dim=1).tolist()
    prefix = torch.arange(keep)[None] < torch.tensor(lengths)[:, None]
    if not torch.equal(attention_mask[:, prompt_width:].bool(), prefix):
        return None
    plan = []  # (prompt, rows) per packed sequence
    for rows in prompt_groups(input_ids[:, :prompt_width], attention_mask[:, :prompt_width]):
        prompt = input_ids[rows[0], :prompt_width][attention_mask[rows[0], :prompt_width].bool()]
        replies = [row for row in rows if lengths[row] > 0]
        if prompt.numel() == 0:
            return None
        replied = [lengths[row] for row in replies]
        if worth_packing(prompt.numel(), replied, pair_cost, sparse=attention == SDPA_FLEX):
            plan.append((prompt, replies))
        else:
            plan.extend((prompt, [row]) for row in replies)
    if all(len(rows) == 1 for _, rows in plan):
        return None
    return packed_chunk(plan, input_ids[:, prompt_width:], lengths, device, attention, dtype)


def packed_chunk(
    plan: list[tuple[torch.Tensor, list[int]]],
    replies: torch.Tensor,
    lengths: list[int],
    device: torch.device,
    attention: str,
    dtype: torch.dtype,
) -> Packed:
    """The :class:`Packed` rows of a packing `plan` ((prompt, rows) per packed sequence) over
    the chunk's completion columns `replies`."""
    sequences = [
        packed_sequence(prompt, [replies[row, : lengths[row]] for row in rows])
        for prompt, rows in plan
    ]
    width = max(sequence[0].numel() for sequence in sequences)
    ids = torch.zeros(len(sequences), width, dtype=replies.dtype)
    position_ids = torch.zeros(len(sequences), width, dtype=torch.long)
    shift_labels = torch.full((len(sequences), width), -100, dtype=replies.dtype)
    segment = torch.full((len(sequences), width), -1, dtype=torch.long)  # -1: padding
    for index, (tokens, positions, segments, labels) in enumerate(sequences):
        ids[index, : tokens.numel()], position_ids[index, : tokens.numel()] = tokens, positions
        segment[index, : tokens.numel()], shift_labels[index, : tokens.numel()] = segments, labels
    rows, columns, sequence_of, positions = scored_places(plan, lengths)
    return Packed(
        input_ids=ids.to(device),
        position_ids=position_ids.to(device),
        attention_mask=segment_mask(segment.to(device), attention, dtype),
        shift_labels=shift_labels.to(device),
        shape=tuple(replies.shape),
        tokens=sum(sequence[0].numel() for sequence in sequences),
        rows=rows.to(device),
        columns=columns.to(device),
        groups=sequence_of.to(device),
        positions=positions.to(device),
    )


@dataclass
class PackedPrefixes:
    """Token sequences packed by :func:`pack_prefixes`: the model inputs, and for each sequence
    (in the order given) its packed row and the position of its last token there."""

    inputs: dict[str, torch.Tensor | BlockMask]
    rows: torch.Tensor
    places: torch.Tensor
    tokens: int  # what the forward reads, the rows' padding excluded

    def last_logits(self, model, columns: list[int]) -> torch.Tensor:
        """`model`'s logits at each sequence's last token (one row per sequence), the vocabulary
        `columns` only; the LM head runs on the read positions alone (``logits_to_keep``)."""
        keep = torch.unique(self.places)
        logits = model(**self.inputs, logits_to_keep=keep).logits
        found = logits[self.rows, torch.searchsorted(keep, self.places)]
        return found[:, columns]


def pack_prefixes(
    sequences: list[list[int]],
    prompts: list[int],
    attention: str = "sdpa",
    dtype: torch.dtype = torch.float32,
    pair_cost: float = 0.0,
    device: torch.device | str = "cpu",
) -> PackedPrefixes | None:
    """Pack token `sequences` whose first `prompts[k]` tokens are a prompt that others share, so
    the prompt is read once: one row per distinct prompt, its sequences' remainders after it,
    each attending to the prompt and to itself (:func:`segment_mask`), positions continuing
    from the prompt's. What a reward that reads the policy after each completion (the slate
    task's ``log_score``) needs: the logits at each sequence's last token, as :func:`pack_groups`
    packs the scoring forwards. A group is packed only where :func:`worth_packing` says so; None
    when none is (the caller's padded rows then read exactly what they always did).

    >>> packed = pack_prefixes([[5, 6, 7], [5, 6, 8, 9], [4, 3]], [2, 2, 1])
    >>> packed.inputs["input_ids"].tolist(), packed.inputs["position_ids"].tolist()
    ([[5, 6, 7, 8, 9], [4, 3, 0, 0, 0]], [[0, 1, 2, 2, 3], [0, 1, 0, 0, 0]])
    >>> packed.rows.tolist(), packed.places.tolist(), packed.tokens
    ([0, 0, 1], [2, 4, 1], 7)
    """
    groups: dict[tuple, list[int]] = {}
    for k, (ids, prompt) in enumerate(zip(sequences, prompts, strict=True)):
        shared = 0 < prompt < len(ids)
        key = (tuple(ids[:prompt]),) if shared else ("alone", k)
        groups.setdefault(key, []).append(k)
    rows: list[tuple[list[int], list[int], list[int]]] = []  # tokens, positions, segments
    row_of, place_of = [0] * len(sequences), [0] * len(sequences)
    packed_any = False
    for members in groups.values():
        prompt = prompts[members[0]]
        rests = [len(sequences[k]) - prompt for k in members]
        if len(members) > 1 and worth_packing(prompt, rests, pair_cost, attention == SDPA_FLEX):
            packed_any = True
            tokens = list(sequences[members[0]][:prompt])
            positions, segments = list(range(prompt)), [0] * prompt
            for number, k in enumerate(members, start=1):
                rest = sequences[k][prompt:]
                tokens += rest
                positions += range(prompt, prompt + len(rest))
                segments += [number] * len(rest)
                row_of[k], place_of[k] = len(rows), len(tokens) - 1
            rows.append((tokens, positions, segments))
            continue
        for k in members:
            ids = list(sequences[k])
            row_of[k], place_of[k] = len(rows), len(ids) - 1
            rows.append((ids, list(range(len(ids))), [0] * len(ids)))
    if not packed_any:
        return None
    width = max(len(tokens) for tokens, _, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    position_ids = torch.zeros(len(rows), width, dtype=torch.long)
    segment = torch.full((len(rows), width), -1, dtype=torch.long)  # -1: padding
    for index, (tokens, positions, segments) in enumerate(rows):
        ids[index, : len(tokens)] = torch.tensor(tokens)
        position_ids[index, : len(tokens)] = torch.tensor(positions)
        segment[index, : len(tokens)] = torch.tensor(segments)
    return PackedPrefixes(
        inputs={
            "input_ids": ids.to(device),
            "position_ids": position_ids.to(device),
            "attention_mask": segment_mask(segment.to(device), attention, dtype),
        },
        rows=torch.tensor(row_of, device=device),
        places=torch.tensor(place_of, device=device),
        tokens=sum(len(tokens) for tokens, _, _ in rows),
    )


def segment_mask(
    segment: torch.Tensor, attention: str = "sdpa", dtype: torch.dtype = torch.float32
) -> torch.Tensor | BlockMask:
    """The mask of packed rows whose tokens are in `segment` (0: the prompt, k: the k-th
    completion, -1: padding): causal, each completion seeing the prompt and itself, a padding
    query itself alone (no row of NaN). In the form `attention` takes: a FlexAttention block
    mask for ``sdpa_flex`` (:func:`grail.train.attention.segment_block_mask`), a boolean 4-D
    mask for SDPA, an additive one in `dtype` for eager attention."""
    if attention == SDPA_FLEX:
        return segment_block_mask(segment)
    width, device = segment.size(1), segment.device
    query, key = segment[:, :, None], segment[:, None, :]
    allowed = torch.ones(width, width, dtype=torch.bool, device=device).tril() & (key >= 0)
    allowed &= (key == 0) | (key == query)
    allowed |= torch.eye(width, dtype=torch.bool, device=device)
    mask = allowed[:, None]
    if attention == "sdpa":
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(
        ~mask, torch.finfo(dtype).min
    )


def scored_places(plan, lengths: list[int]) -> tuple[torch.Tensor, ...]:
    """For every scored token of a packing `plan` ((prompt, rows) per packed sequence): its
    row and column in the chunk, its packed sequence and its position there."""
    rows, columns, sequence_of, positions = [], [], [], []
    for index, (prompt, group) in enumerate(plan):
        at = prompt.numel() - 1  # where the group's first completion starts
        for row in group:
            rows.append(torch.full((lengths[row],), row))
            columns.append(torch.arange(lengths[row]))
            sequence_of.append(torch.full((lengths[row],), index))
            positions.append(torch.arange(at, at + lengths[row]))
            at += lengths[row]
    return tuple(torch.cat(part) for part in (rows, columns, sequence_of, positions))


def prompt_groups(prompts: torch.Tensor, prompt_masks: torch.Tensor) -> list[list[int]]:
    """The rows of each distinct prompt (its tokens where the mask is set), in the order each
    first appears: TRL shuffles a generation batch's rows before its micro-batches.

    >>> prompts = torch.tensor([[0, 4], [3, 3], [0, 4]])
    >>> prompt_groups(prompts, (prompts > 0).long())
    [[0, 2], [1]]
    """
    groups: dict[bytes, list[int]] = {}
    for row in range(prompts.size(0)):
        key = prompts[row][prompt_masks[row].bool()].numpy().tobytes()
        groups.setdefault(key, []).append(row)
    return list(groups.values())


def packed_sequence(prompt: torch.Tensor, replies: list[torch.Tensor]):
    """One packed sequence: its tokens, positions, segment of each token (0: the prompt; k:
    the k-th reply) and the label each position predicts (-100 on the prompt)."""
    start = prompt.numel() - 1
    tokens, positions, segments = [prompt[:-1]], [torch.arange(start)], [torch.zeros(start)]
    labels = [torch.full((start,), -100, dtype=prompt.dtype)]
    for number, reply in enumerate(replies, start=1):
        tokens.append(torch.cat([prompt[-1:], reply[:-1]]))
        positions.append(torch.arange(start, start + reply.numel()))
        segments.append(torch.full((reply.numel(),), number))
        labels.append(reply)
    return (
        torch.cat(tokens),
        torch.cat(positions),
        torch.cat(segments).long(),
        torch.cat(labels),
    )


def worth_packing(prompt: int, replies: list[int], pair_cost: float, sparse: bool = False) -> bool:
    """Whether a group of completions (`replies` tokens each) costs less packed after one copy
    of its `prompt` than sent as rows of their own: a token costs 1 (the linear layers) and a
    pair of positions that attention scores `pair_cost`. A dense mask's kernel scores every
    pair of a row, so a packed row of many long completions can cost more than the rows it
    saves; a block mask (`sparse`) skips the pairs between two completions.

    >>> worth_packing(500, [16] * 8, 6.6e-5), worth_packing(500, [2048] * 8, 6.6e-5)
    (True, False)
    >>> worth_packing(500, [2048] * 8, 6.6e-5, sparse=True)
    True
    """
    if len(replies) < 2:
        return False
    packed = prompt + sum(replies)
    alone = sum(prompt + reply for reply in replies)
    pairs = (
        prompt**2 + sum(2 * prompt * reply + reply**2 for reply in replies) if sparse else packed**2
    )
    return packed + pair_cost * pairs < alone + pair_cost * sum(
        (prompt + reply) ** 2 for reply in replies
    )


def attention_pair_cost(config) -> float:
    """What attention spends on one pair of positions, in units of what the linear layers spend
    on one token: 2 x heads x head size over a layer's linear weights (multiply-adds of QK and
    AV per pair against those of the weights per token). 0 where the config does not say."""
    hidden = getattr(config, "hidden_size", None)
    heads = getattr(config, "num_attention_heads", None)
    intermediate = getattr(config, "intermediate_size", None)
    if not (hidden and heads and intermediate):
        return 0.0
    head = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    weights = 2 * hidden * heads * head + 2 * hidden * kv_heads * head + 3 * hidden * intermediate
    return 2 * heads * head / weights


def shuffle_groups(batch: dict) -> dict:
    """TRL's shuffle of a generation batch (``trl.trainer.utils.shuffle_sequence_dict``) by
    group: the groups (rows of one prompt) in random order, each group's rows together, so a
    micro-batch holds whole groups for :func:`pack_groups`. Row-wise where the batch has no
    ``prompt_ids``/``prompt_mask``.
    """
    from trl.trainer.utils import shuffle_sequence_dict

    if batch.get("prompt_ids") is None or batch.get("prompt_mask") is None:
        return shuffle_sequence_dict(batch)
    groups = prompt_groups(batch["prompt_ids"].cpu(), batch["prompt_mask"].cpu())
    order = torch.randperm(len(groups)).tolist()
    permutation = torch.tensor([row for g in order for row in groups[g]])

    def permute(values):
        if values is None or isinstance(values, torch.Tensor) and values.ndim == 0:
            return values
        if isinstance(values, torch.Tensor):
            return values[permutation.to(values.device)]
        return [values[i] for i in permutation]

    return {key: permute(values) for key, values in batch.items()}


# keyword arguments of TRL's forward helper that a text-only batch leaves None or sets itself
TEXT_ONLY = {"compute_entropy", "compute_aux_loss"}


def trimmed(attention_mask: torch.Tensor, logits_to_keep: int) -> tuple[int, int]:
    """The first column of a chunk that is not left padding in every row (never inside the
    completion), and how many completion columns to keep (the last one any row uses; at least
    one).

    >>> trimmed(torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]]), 3)
    (1, 2)
    """
    prompt = attention_mask.size(1) - logits_to_keep
    used = attention_mask.any(dim=0).nonzero().flatten()
    first = min(int(used[0]), prompt) if used.numel() else prompt
    completion = attention_mask[:, prompt:].any(dim=0).nonzero().flatten()
    keep = int(completion[-1]) + 1 if completion.numel() else 1
    return first, keep


def padded(values: torch.Tensor, width: int) -> torch.Tensor:
    """``values`` (rows x kept columns) padded with zeros on the right to ``width`` columns."""
    return torch.nn.functional.pad(values, (0, width - values.size(1)))


def redundant_old_forward(trainer: GRPOTrainer) -> bool:
    """Whether TRL's no-grad policy forward under vLLM computes what the training forward
    will: the correction is on, and the whole generation batch trains with the policy as it
    was when it generated (one iteration, one optimizer step per generation batch)."""
    args = trainer.args
    return (
        trainer.vllm_importance_sampling_correction
        and trainer.num_iterations == 1
        and args.steps_per_generation == args.gradient_accumulation_steps
    )


def bf16_autocast_single_process(args) -> bool:
    """Training runs in bf16 autocast over fp32 weights (one process, no DeepSpeed: grail's
    fp32 masters, :func:`grail.train.multigpu.master_dtype`)."""
    from grail.train.multigpu import deepspeed_active

    return bool(args.bf16) and not deepspeed_active(args)


def reference_linears_in_bf16(model: torch.nn.Module) -> int:
    """Cast the reference model's linear layers to bf16 in place, except an LM head tied to the
    embeddings (the embeddings feed the residual stream in their own dtype); returns how many.

    Under bf16 autocast every linear runs in bf16 whatever its weight's dtype, so the
    reference's log-probabilities do not change (tests/test_grpo_passes.py checks bit
    identity).
    """
    embeddings = model.get_input_embeddings()
    tied = embeddings is not None and getattr(embeddings, "weight", None)
    cast = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight is not tied:
            module.to(torch.bfloat16)
            cast += 1
    return cast
