"""Attention over a packed batch, as a function transformers' attention modules call.

A packed batch's real tokens run back to back as one sequence ``(1, N)``. Everything but attention
is transformers' own code, op for op; attention is a function registered with transformers'
``AttentionInterface`` under :data:`ATTENTION`. It cuts the packed queries, keys and values into
per-text grids (texts of similar length share a grid, as in the encoders' packed forward,
packed.py) and runs attention there: causal with ``scaled_dot_product_attention``, or, where the
model soft-caps its scores (Gemma 2) or has a sliding window shorter than a text, the eager formula
with those applied; both ways for an encoder's layer (ModernBERT), padding masked. Right padding
inside a causal grid needs no mask: a real token's window ends before any padding.

The grids come with each call, as the keyword :data:`GROUPS` that a decoder layer passes down to
its attention (transformers' layers hand their extra keywords on), so forwards of different batches
may run the same modules at once. The modules find this function by their config's attention
implementation: they run with a config of ours (:func:`packed_config`), never the user's.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F

ATTENTION = "layerwise_packed"
GROUPS = "layerwise_groups"  # the keyword that carries a batch's attention grids (packed.AttentionGroup)


def register_packed_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, packed_attention)


def packed_config(config: Any) -> Any:
    """A copy of ``config`` whose attention modules call :func:`packed_attention` (the model's own
    config is left as it is)."""
    register_packed_attention()
    ours = copy.deepcopy(config)
    ours._attn_implementation = ATTENTION
    return ours


def _attend_both_ways(query, key, value, *, scaling, window: int | None, key_mask):
    """Bidirectional attention of one grid ``(B, heads, T, d)`` (an encoder's: ModernBERT), over
    real keys only, each query seeing keys within ``window`` positions where its layer is local."""
    allowed = key_mask  # (B, 1, 1, T) or None: a grid without padding
    t = query.shape[2]
    if window is not None and t > window:
        i = torch.arange(t, device=query.device)
        near = (i[None, :] - i[:, None]).abs() <= window
        allowed = near if allowed is None else allowed & near
    return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling)


def _attend(query, key, value, *, scaling, causal_window: int | None, softcap: float | None):
    """Causal attention of one grid ``(B, heads, T, d)``; keys and values may have fewer heads."""
    groups = query.shape[1] // key.shape[1]
    t = query.shape[2]
    if softcap is None and (causal_window is None or t <= causal_window):
        return F.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scaling, enable_gqa=groups > 1
        )
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # transformers' eager formula
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    i = torch.arange(t, device=query.device)
    allowed = i[None, :] <= i[:, None]
    if causal_window is not None:
        allowed &= i[None, :] > i[:, None] - causal_window
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value)


def packed_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    sliding_window=None,
    softcap=None,
    **kwargs,
):
    """transformers' attention interface for a packed batch: query ``(1, heads, N, d)``, keys and
    values ``(1, kv_heads, N, d)`` -> ``(1, N, heads, d)``; the batch's grids in ``kwargs[GROUPS]``."""
    groups = kwargs.get(GROUPS)
    if groups is None:
        raise RuntimeError(
            f"layerwise's packed attention called without the batch's grids ({GROUPS}=): it runs inside "
            "layerwise's packed forward only"
        )
    q, k, v = query[0], key[0], value[0]  # (heads, N, d)
    out = q.new_empty(q.shape[1], q.shape[0], q.shape[2])  # (N, heads, d)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    for group in groups:
        parts = []
        for x in (q, k, v):
            x = x[:, group.start : group.stop]  # (heads, N_g, d)
            if group.flat is not None:
                grid = x.new_zeros(x.shape[0], group.count * group.width, x.shape[2])
                grid.index_copy_(1, group.flat, x)
                x = grid
            parts.append(x.view(x.shape[0], group.count, group.width, x.shape[2]).transpose(0, 1))
        if getattr(module, "is_causal", True):
            context = _attend(*parts, scaling=scale, causal_window=sliding_window, softcap=softcap)
        else:  # an encoder's layer (ModernBERT): both ways, padding masked; a local layer's window is
            # the config's, as transformers' bidirectional mask reads it (the layer's own is flash's, +1)
            window = module.config.sliding_window if sliding_window is not None else None
            context = _attend_both_ways(*parts, scaling=scale, window=window, key_mask=group.key_mask)
        context = context.transpose(1, 2).reshape(group.count * group.width, q.shape[0], q.shape[2])
        out[group.start : group.stop] = context if group.flat is None else context.index_select(0, group.flat)
    return out[None], None
