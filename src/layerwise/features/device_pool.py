"""Sentence pooling where the states are: a packed batch's hidden states ``(L, N, H)`` (the real
tokens of B inputs, one after another) to one vector per input and layer, ``(L, B, H)`` float32, in
torch on the model's device, before anything crosses to the host.

The numbers are those of :func:`pool.pool_sentence` on each input's own states (tests compare every
pool and special-tokens choice): cls is the first token, last the last (with ``exclude``, the last
content token), mean the mean, max the element-wise maximum; ``exclude`` pools over content tokens
only, and an input with none falls back to all of its tokens. Sums are taken in float32 (a float16 or
bfloat16 model's states are widened first); the host path sums in float64, and the two agree to
1e-6 relative on inputs of up to 512 tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

DEVICE_POOLS = ("cls", "mean", "max", "last")


def content_mask(word_ids: Sequence[Sequence[int | None]], device: torch.device) -> torch.Tensor:
    """``(N,)`` bool over the packed tokens: True for a content token (one with a word id)."""
    flat = [w is not None and w >= 0 for ids in word_ids for w in ids]
    return torch.tensor(flat, dtype=torch.bool).to(device, non_blocking=True)


def pool_packed(
    hidden: torch.Tensor,
    lengths: Sequence[int],
    pool: str,
    content: torch.Tensor | None = None,
) -> torch.Tensor:
    """``hidden`` (L, N, H) of inputs of ``lengths`` -> (L, B, H) float32. ``content``: the tokens to
    pool over (``exclude``); None pools over every token (``include``)."""
    if pool not in DEVICE_POOLS:
        raise ValueError(f"pool {pool!r}: one of {DEVICE_POOLS}")
    device = hidden.device
    n_layers, n_tokens, width = hidden.shape
    sizes = torch.tensor(list(lengths), dtype=torch.long).to(device, non_blocking=True)
    n_inputs = len(lengths)
    starts = torch.cumsum(sizes, 0) - sizes
    if pool == "cls":
        return hidden[:, starts].float()
    owner = torch.repeat_interleave(torch.arange(n_inputs, device=device), sizes, output_size=n_tokens)
    if content is not None:
        # an input with no content token (an empty text) pools over its special tokens instead
        has_content = torch.zeros(n_inputs, dtype=torch.long, device=device).index_add_(
            0, owner, content.long()
        )
        selected = content | (has_content == 0)[owner]
    else:
        selected = None
    if pool == "last":
        if selected is None:
            return hidden[:, starts + sizes - 1].float()
        position = torch.arange(n_tokens, device=device)
        chosen = torch.full((n_inputs,), -1, dtype=torch.long, device=device)
        chosen = chosen.scatter_reduce(0, owner[selected], position[selected], reduce="amax")
        return hidden[:, chosen].float()
    if selected is not None:
        hidden, owner = hidden[:, selected], owner[selected]
    states = hidden.float()
    if pool == "mean":
        counts = torch.zeros(n_inputs, dtype=torch.float32, device=device).index_add_(
            0, owner, torch.ones_like(owner, dtype=torch.float32)
        )
        sums = torch.zeros(n_layers, n_inputs, width, dtype=torch.float32, device=device)
        sums.index_add_(1, owner, states)
        return sums / counts[None, :, None]
    out = torch.full((n_layers, n_inputs, width), float("-inf"), dtype=torch.float32, device=device)
    index = owner[None, :, None].expand(n_layers, -1, width)
    return out.scatter_reduce(1, index, states, reduce="amax", include_self=True)
