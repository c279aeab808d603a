"""Pooling where the states are: a packed batch's hidden states ``(L, N, H)`` (the real tokens of B
inputs, one after another) to one vector per input (a sentence plan) or per word (a word plan) and
layer, ``(L, rows, H)`` float32, in torch on the model's device, before anything crosses to the host.

The numbers are those of :func:`pool.pool_sentence` and :func:`pool.pool_words` on each input's own
states (tests compare every pool and special-tokens choice): a *group* is an input or a word, and
each pool reduces the tokens of its group: first (cls), last, mean, max, first_last (first and last
concatenated). A sentence pool with ``exclude`` pools over content tokens only (cls stays the first
token), and an input with none falls back to all of its tokens. Sums are taken in float32 (a float16
or bfloat16 model's states are widened first); the host path sums in float64, and the two agree to
1e-6 relative on inputs of up to 512 tokens.

:func:`finish` then does the rest of the plan there too, on the pooled rows: the layer fusion
(select, sum, mean, concat; sums in float64 as :func:`fuse.fuse_layers`) and a sentence plan's L2
normalisation. What crosses to the host is the plan's result, and the host only slices it per input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from .fuse import fusion_layers
from .names import NAMED_FUSIONS, SENTENCE_POOLS, SUBWORD_POOLS

if TYPE_CHECKING:  # the batch's columns (inputs/block.py): read here, never built
    from .._inputs.block import TokenColumns

# what a group of tokens (a word, or a sentence) is pooled with: the word pools; a sentence pool is
# one of them over the sentence's tokens ([CLS] is its first)
GROUP_POOLS = SUBWORD_POOLS
SENTENCE_AS_GROUP = {pool: "first" if pool == "cls" else pool for pool in SENTENCE_POOLS}


def pool_groups(hidden: torch.Tensor, owner: np.ndarray, n_groups: int, pool: str) -> torch.Tensor:
    """``hidden`` (L, N, H) -> (L, n_groups, H) float32 ((L, n_groups, 2H) for first_last): each
    group's ``pool`` over the tokens ``owner`` (N,) assigns to it (-1: no group). Every group must
    own at least one token. ``owner`` is a host array: which tokens count is settled there, so the
    device never waits on a mask."""
    if pool not in GROUP_POOLS:
        raise ValueError(f"pool {pool!r}: one of {GROUP_POOLS}")
    device = hidden.device
    n_layers, n_tokens, width = hidden.shape
    kept = np.flatnonzero(owner >= 0)
    every_token = len(kept) == n_tokens  # then no gather: the states are reduced as they are
    position, group = _to_device(kept, device), _to_device(owner[kept], device)
    if pool in ("first", "last", "first_last"):
        ends = {}
        for end, reduce, fill in (("first", "amin", n_tokens), ("last", "amax", -1)):
            if pool in (end, "first_last"):
                start = torch.full((n_groups,), fill, dtype=torch.long, device=device)
                ends[end] = hidden[:, start.scatter_reduce(0, group, position, reduce=reduce)].float()
        return torch.cat([ends["first"], ends["last"]], dim=-1) if pool == "first_last" else ends[pool]
    states = (hidden if every_token else hidden[:, position]).float()
    if pool == "mean":
        counts = torch.zeros(n_groups, dtype=torch.float32, device=device)
        counts.index_add_(0, group, torch.ones_like(group, dtype=torch.float32))
        sums = torch.zeros(n_layers, n_groups, width, dtype=torch.float32, device=device)
        sums.index_add_(1, group, states)
        return sums / counts[None, :, None]
    out = torch.full((n_layers, n_groups, width), float("-inf"), dtype=torch.float32, device=device)
    index = group[None, :, None].expand(n_layers, -1, width)
    return out.scatter_reduce(1, index, states, reduce="amax", include_self=True)


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host index array on ``device`` without waiting for it: on a GPU from pinned memory (torch's
    caching host allocator reuses it), since a copy from pageable memory would wait for the forward
    just launched on the stream."""
    tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def sentence_owner(columns: TokenColumns, special_tokens: str, pool: str) -> np.ndarray:
    """Each packed token's input, or -1 for a token the sentence pool leaves out (``exclude``:
    special tokens, unless the input has no content token; cls always reads the first token)."""
    lengths = np.asarray(columns.lengths, dtype=np.int64)
    owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    if special_tokens == "exclude" and pool != "cls" and len(owner):
        assert columns.word_ids is not None
        special = columns.word_ids < 0
        has_content = np.add.reduceat(~special, columns.starts) > 0
        owner[special & has_content[owner]] = -1
    return owner


def word_owner(columns: TokenColumns) -> tuple[np.ndarray, list[int]]:
    """Each packed token's word across the batch (-1 for special tokens) and each input's number of
    words: words numbered input by input, each input's in order of first appearance of its
    (segment, word id) pairs, as :func:`pool.word_groups` numbers them."""
    assert columns.word_ids is not None and columns.segments is not None
    lengths = np.asarray(columns.lengths, dtype=np.int64)
    text = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    word = columns.word_ids.astype(np.int64)
    kept = np.flatnonzero(word >= 0)
    owner = np.full(len(word), -1, dtype=np.int64)
    if not len(kept):
        return owner, [0] * len(lengths)
    span = int(word.max()) + 1
    keys = (text[kept] * 2 + columns.segments[kept].astype(np.int64)) * span + word[kept]
    unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    rank = np.empty(len(unique), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(unique))  # by first appearance
    owner[kept] = rank[inverse.reshape(-1)]
    counts = np.bincount(unique // (2 * span), minlength=len(lengths))
    return owner, counts.tolist()


def batch_groups(columns: TokenColumns, plan: DevicePlan) -> tuple[np.ndarray, list[int], int, str]:
    """What a plan pools a batch's tokens into: each token's row (-1: none), each input's number of
    rows (1 per input for a sentence), the number of rows, and the group pool that makes them.
    Settled on the host once a batch (a streamed block pools every layer with it: _engine/blocks.py)."""
    if plan.level == "sentence":
        owner = sentence_owner(columns, plan.special_tokens, plan.pool)
        n = len(columns.lengths)
        return owner, [1] * n, n, SENTENCE_AS_GROUP[plan.pool]
    owner, sizes = word_owner(columns)
    return owner, sizes, sum(sizes), plan.pool


def pool_batch(
    hidden: torch.Tensor, columns: TokenColumns, plan: DevicePlan
) -> tuple[torch.Tensor, list[int], np.ndarray]:
    """A packed batch's states pooled per input (a sentence plan) or per word (a word plan), where
    they are: ``(L, rows, H)``, each input's number of rows (1 per input for a sentence), and each
    token's row (-1: none), which the host reads again to describe the rows (a word's tokens)."""
    owner, sizes, n_groups, group_pool = batch_groups(columns, plan)
    return pool_groups(hidden, owner, n_groups, group_pool), sizes, owner


@dataclass(frozen=True)
class DevicePlan:
    """What a sentence or word plan computes on the model's device from a batch's states: the pool
    (``level`` "sentence" or "word", ``pool``, ``special_tokens``), then the fusion of the hidden
    states ``layers`` (of ``n_hidden_states``) and a sentence's normalisation."""

    level: str
    pool: str
    special_tokens: str = "include"
    fuse: str | None = None
    normalize: bool = False
    n_hidden_states: int = 0


def finish(pooled: torch.Tensor, layers: Sequence[int], plan: DevicePlan) -> torch.Tensor:
    """``pooled`` (L, rows, W) of hidden states ``layers`` -> the plan's result rows, (L, rows, W) or
    (1, rows, D) when fused: the numbers of :func:`fuse.fuse_layers` and :meth:`OutputPlan.result`'s
    normalisation, computed where the rows are."""
    if plan.fuse is not None:
        wanted = fusion_layers(plan.fuse, plan.n_hidden_states)
        layers = list(layers)
        picked = pooled if wanted is None else pooled[[layers.index(i) for i in wanted]]
        operation = NAMED_FUSIONS[plan.fuse][1] if plan.fuse in NAMED_FUSIONS else plan.fuse
        if operation == "select":
            pooled = picked[:1]
        elif operation == "sum":
            pooled = picked.double().sum(dim=0, keepdim=True).float()
        elif operation == "mean":
            pooled = picked.double().mean(dim=0, keepdim=True).float()
        else:  # concat, in the model's layer order
            pooled = torch.cat(list(picked), dim=-1)[None]
    if plan.normalize and plan.level == "sentence":  # x / max(||x||, 1e-12), as sentence-transformers
        pooled = pooled / torch.linalg.vector_norm(pooled, dim=-1, keepdim=True).clamp_min(1e-12)
    return pooled
