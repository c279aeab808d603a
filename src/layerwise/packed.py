"""Packed (unpadded) forward: the real tokens of a batch back to back, no padding anywhere but
inside attention.

A padded batch ``(B, T)`` spends every linear layer, LayerNorm, GELU and residual on ``B x T``
rows, padding included. Here the hidden state is ``(N, H)`` with ``N`` = the real tokens only: the
model's own embedding, attention-output, intermediate and output modules run on those rows
unchanged (same weights, same code), and only the score/softmax/context step scatters queries, keys
and values into a per-sequence ``(B, heads, T, d)`` grid for ``scaled_dot_product_attention`` with
a key mask, then gathers the real rows back. Hidden states equal the padded Hugging Face forward
to float rounding (tests: every layer, every supported architecture, pairs, windows, truncation).

Supported: BERT-style encoders with absolute positions (bert, roberta, xlm-roberta, camembert,
electra: MiniLM is a bert). Others (DistilBERT, MPNet: different attention), decoders, relative
position embeddings and sub-layer taps use the Hugging Face forward (``PackedEncoder.build`` -> None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

PACKED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "electra")
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert")  # positions start at padding_idx + 1


@dataclass
class PackedBatch:
    """Index tensors of one packed batch, shared by every layer."""

    ids: torch.Tensor  # (N,) token ids back to back
    types: torch.Tensor  # (N,) token type ids
    positions: torch.Tensor  # (N,) position ids (the model's convention)
    flat: torch.Tensor  # (N,) row * T + column: where each token sits in the (B, T) grid
    key_mask: torch.Tensor  # (B, 1, 1, T) True for real keys
    lengths: list[int]
    width: int  # T


class PackedEncoder:
    """The packed forward of a Hugging Face BERT-family model, on the model's own modules."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.model_type: str = model.config.model_type
        self.embeddings = model.embeddings
        self.project = getattr(model, "embeddings_project", None)  # ELECTRA: embedding -> hidden size
        self.layers = list(model.encoder.layer)
        self.n_heads: int = model.config.num_attention_heads
        self.padding_idx: int = getattr(model.embeddings, "padding_idx", 0) or 0
        self._qkv: dict[int, tuple] = {}  # id(self-attention module) -> (versions, weight, bias)

    @classmethod
    def build(cls, model: Any) -> PackedEncoder | None:
        """A packed forward for ``model``, or None when it cannot express it exactly."""
        config = model.config
        if config.model_type not in PACKED_MODEL_TYPES:
            return None
        if getattr(config, "position_embedding_type", "absolute") not in (None, "absolute"):
            return None
        if getattr(config, "is_decoder", False) or getattr(config, "chunk_size_feed_forward", 0):
            return None
        encoder = getattr(model, "encoder", None)
        if encoder is None or not hasattr(encoder, "layer") or not hasattr(model, "embeddings"):
            return None
        first = encoder.layer[0]
        needed = ("attention", "intermediate", "output")
        if not all(hasattr(first, name) for name in needed) or not hasattr(first.attention, "self"):
            return None
        projections = [getattr(first.attention.self, n, None) for n in ("query", "key", "value")]
        if any(p is None or getattr(p, "bias", None) is None for p in projections):
            return None
        return cls(model)

    def prepare(
        self,
        items: Sequence[Any],  # EncodedInput | Window: .ids, .type_ids, len()
        *,
        with_token_types: bool,
        device: torch.device,
    ) -> PackedBatch:
        lengths = [len(item) for item in items]
        width = max(lengths)
        ids = torch.tensor([i for item in items for i in item.ids], dtype=torch.long)
        if with_token_types:
            types = torch.tensor([t for item in items for t in item.type_ids], dtype=torch.long)
        else:
            types = torch.zeros(len(ids), dtype=torch.long)
        lengths_t = torch.tensor(lengths, dtype=torch.long)
        row = torch.repeat_interleave(torch.arange(len(items)), lengths_t)
        starts = torch.cumsum(lengths_t, 0) - lengths_t
        column = torch.arange(len(ids)) - starts[row]
        positions = column + (self.padding_idx + 1 if self.model_type in _OFFSET_POSITIONS else 0)
        key_mask = (torch.arange(width)[None, :] < lengths_t[:, None])[:, None, None, :]
        flat = row * width + column
        ids, types, positions, flat, key_mask = (
            t.to(device, non_blocking=True) for t in (ids, types, positions, flat, key_mask)
        )
        return PackedBatch(ids, types, positions, flat, key_mask, lengths=lengths, width=width)

    def forward(self, batch: PackedBatch, layers: Sequence[int]) -> torch.Tensor:
        """Hidden states ``layers`` (0 = embeddings) of the packed batch: ``(len(layers), N, H)``."""
        h = self.embeddings(
            input_ids=batch.ids[None], token_type_ids=batch.types[None], position_ids=batch.positions[None]
        )[0]
        if self.project is not None:
            h = self.project(h)
        wanted = set(layers)
        states: dict[int, torch.Tensor] = {0: h} if 0 in wanted else {}
        for depth, layer in enumerate(self.layers[: max(layers)], start=1):
            h = self._layer(layer, h, batch)
            if depth in wanted:
                states[depth] = h
        return torch.stack([states[i] for i in layers])

    def _layer(self, layer: Any, h: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        attention = layer.attention
        self_attention = attention.self
        context = self._attend(self_attention, h, batch)
        a = attention.output(context, h)  # dense, dropout, LayerNorm(. + h)
        return layer.output(layer.intermediate(a), a)  # dense+act, then dense, dropout, LayerNorm(. + a)

    def _fused_qkv(self, module: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Query, key and value projections as one matrix (one larger matmul instead of three), cached
        per layer and rebuilt whenever any of the six tensors has changed (their version counters):
        weights edited in place after loading are never served stale."""
        parts = (module.query.weight, module.key.weight, module.value.weight,
                 module.query.bias, module.key.bias, module.value.bias)  # fmt: skip
        stamp = tuple((id(t), t._version) for t in parts)
        cached = self._qkv.get(id(module))
        if cached is None or cached[0] != stamp:
            cached = (stamp, torch.cat(parts[:3]), torch.cat(parts[3:]))
            self._qkv[id(module)] = cached
        return cached[1], cached[2]

    def _attend(self, module: Any, h: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        n, hidden = h.shape
        b, t, heads = len(batch.lengths), batch.width, self.n_heads
        d = hidden // heads
        weight, bias = self._fused_qkv(module)
        qkv = F.linear(h, weight, bias)  # (N, 3H)
        dense = n == b * t  # every sequence as long as the longest: the packed rows are the grid
        if not dense:  # one scatter of q, k and v together into the (B, T) grid, zeros at padding
            grid = qkv.new_zeros(b * t, 3 * hidden)
            grid.index_copy_(0, batch.flat, qkv)
            qkv = grid
        q, k, v = qkv.view(b, t, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)  # (B, heads, T, d) each
        mask = None if dense else batch.key_mask
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=module.scaling)
        context = context.transpose(1, 2).reshape(b * t, hidden)
        return context if dense else context.index_select(0, batch.flat)
