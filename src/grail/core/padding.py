"""Padding and attention: the mask a right-padded batch needs is none.

A causal LM attends from each position to the ones before it, so in a batch padded on the
right (each row its tokens, then its pads) no real token ever sees a pad, and Qwen2's (and
Llama's) positions come from the sequence index, not from the mask. An explicit mask only makes
PyTorch's SDPA build and apply the whole L x L mask, where causal attention alone (``is_causal``)
skips the upper triangle: the tiny policy's cloning step is about a quarter faster so, the real
tokens' hidden states equal to the bit (``bench/padding.py``; figures in docs/development.md)."""

from __future__ import annotations


def causal_attention_mask(mask):
    """`mask` (a 0/1 tensor, one row per sequence), or None where every row is right padded
    (ones, then zeros: causal attention alone then gives the real tokens the same outputs); a
    row with a pad before a token keeps the mask.

    >>> import torch
    >>> causal_attention_mask(torch.tensor([[1, 1, 1], [1, 1, 0]])) is None
    True
    >>> causal_attention_mask(torch.tensor([[0, 1, 1], [1, 1, 1]])).tolist()
    [[0, 1, 1], [1, 1, 1]]
    """
    if mask is None or bool((mask[:, 1:] <= mask[:, :-1]).all()):
        return None
    return mask
