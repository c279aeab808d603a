"""Batches: which inputs run together in one forward pass, planned from their token counts."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError

PAD_SLACK = 0.25  # an item may be padded by up to a quarter of its batch's width…
PAD_SLACK_TOKENS = 16  # …or 16 tokens, whichever is more


@dataclass(frozen=True)
class TokenUnit:
    """A sequence the engine runs as it is, with no windows (``Engine.forward_units``): token ids
    and segment ids. The activation cache's contexts and the GPU warm-up's batch are made of them."""

    ids: tuple[int, ...]
    type_ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.ids)


def one_length_batches(batches: list[list[int]], lengths: Sequence[int]) -> list[list[int]]:
    """``batches`` (length-sorted) split so that each holds items of one length: for a model whose
    states padding changes (ConvBERT, YOSO: _model/forward/padded.py)."""
    return [list(same) for batch in batches for _, same in itertools.groupby(batch, key=lambda i: lengths[i])]


def length_sorted_batches(
    lengths: Sequence[int], batch_size: int, max_tokens: int | None = None, *, padded: bool = True
) -> list[list[int]]:
    """Group item indices into batches of similar length, longest first.

    A batch holds at most ``batch_size`` items and, when ``max_tokens`` is set, at most
    ``max_tokens`` padded tokens (items x its longest item); an item longer than the budget gets a
    batch of its own, and an item that would be padded by more than PAD_SLACK of the batch's width
    (and PAD_SLACK_TOKENS) starts a new one. Sorting keeps padding small; longest first makes an
    out-of-memory error show up in the first batch rather than after an hour (sentence-transformers'
    ``encode`` does the same).

    ``padded=False`` is for the packed forward, which has no padding outside attention and splits
    attention into groups of similar length itself (packed.attention_groups): the budget counts real
    tokens and a shorter item never starts a new batch, so a stream of mixed lengths (a server's
    merged requests) runs as a few large batches instead of many small ones.
    """
    if batch_size < 1:
        raise OptionError(f"batch_size={batch_size} must be >= 1")
    if max_tokens is not None and max_tokens < 1:
        raise OptionError(f"max_tokens={max_tokens} must be >= 1, or None for no token budget")
    if not padded:
        return _packed_batches(lengths, batch_size, max_tokens)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    width = tokens = 0
    for i in order:
        # a much shorter item starts a new batch rather than be padded to this one's width: padding
        # costs as much as real tokens, a new forward pass only its fixed overhead (a few tokens' worth)
        too_short = padded and width - lengths[i] > max(PAD_SLACK_TOKENS, width * PAD_SLACK)
        cost = width * (len(current) + 1) if padded else tokens + lengths[i]
        over_budget = max_tokens is not None and cost > max_tokens
        if current and (len(current) >= batch_size or over_budget or too_short):
            batches.append(current)
            current = []
            tokens = 0
        if not current:
            width = lengths[i]  # longest first: the first item sets the batch's padded width
        current.append(i)
        tokens += lengths[i]
    if current:
        batches.append(current)
    return batches


def _packed_batches(lengths: Sequence[int], batch_size: int, max_tokens: int | None) -> list[list[int]]:
    """:func:`length_sorted_batches` with ``padded=False``: items sorted longest first (ties in input
    order), cut where the next item would pass ``batch_size`` items or ``max_tokens`` real tokens (an
    item over the budget alone gets a batch of its own); one search per batch, not a loop per item."""
    sizes = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-sizes, kind="stable")
    total = np.concatenate([[0], np.cumsum(sizes[order])])
    batches, start, n = [], 0, len(order)
    while start < n:
        stop = min(n, start + batch_size)
        if max_tokens is not None:
            fits = int(np.searchsorted(total, total[start] + max_tokens, side="right")) - 1
            stop = min(stop, max(fits, start + 1))
        batches.append(order[start:stop].tolist())
        start = stop
    return batches
