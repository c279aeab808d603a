"""Packed (unpadded) forward: the real tokens of a batch back to back, no padding anywhere but
inside attention.

A padded batch ``(B, T)`` spends every linear layer, LayerNorm, GELU and residual on ``B x T``
rows, padding included. Here the hidden state is ``(N, H)`` with ``N`` = the real tokens only: the
model's embedding, attention-output, intermediate and output modules run on those rows unchanged
(the transformers model's own, or light.py's, which hold the same weights under the same
names and run the same torch ops), and only the score/softmax/context step scatters queries, keys
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

import numpy as np
import torch
import torch.nn.functional as F

from ..families.kinds import BERT_LAYOUT
from ..families.table import family
from ..positions import first_position
from .cpu_gemm import PrepackedLinears
from .layer_loop import Resident, run_block

PACKED_MODEL_TYPES = BERT_LAYOUT


@dataclass
class PackedBatch:
    """Index tensors of one packed batch, shared by every layer."""

    ids: torch.Tensor  # (N,) token ids back to back
    types: torch.Tensor  # (N,) token type ids
    positions: torch.Tensor  # (N,) position ids (the model's convention)
    lengths: list[int]
    groups: list[AttentionGroup]  # consecutive sequences that share one attention grid


@dataclass
class AttentionGroup:
    """Consecutive sequences of a packed batch whose attention runs as one ``(B_g, heads, T_g, d)``
    grid: their tokens are rows ``start:stop`` of the packed batch."""

    start: int
    stop: int
    count: int  # B_g sequences
    width: int  # T_g, the longest of them
    flat: torch.Tensor | None  # (stop - start,) row * T_g + column in the grid; None: no padding
    key_mask: torch.Tensor | None  # (B_g, 1, 1, T_g) True for real keys; None: no padding


# Attention of a padded grid costs B x T^2; splitting a batch of mixed lengths into groups of similar
# length saves most of it (one 256-token text among 31 20-token sentences: attention padded to 256
# costs as many multiply-adds as all the batch's linear layers, 30x what the real pairs need), but
# each group costs a few kernel launches. The split (attention_groups) minimises B_g * T_g^2 +
# GROUP_COST over groups of consecutive sequences; GROUP_COST is that overhead in query-key pairs.
# Random 32-text batches of the serving benchmark ran at the same speed within noise for GROUP_COST
# from 1,024 to 16,384 and 10 % slower at 65,536 (ad-hoc sweep, default model).
GROUP_COST = 4096
# On a GPU each group is a handful of kernel launches, each worth far more than 4,096 query-key pairs
# of arithmetic: short UD EWT sentences in batches of 1,024 on an H200 (BERT-base shape, float16) ran
# the packed forward at 716,687 tokens/s with 4,096 (15, 5 and 3 groups a batch), 1,191,404 with
# 2^20 (4, 1, 1), 1,155,071 with 2^24 and 836,436 with one grid a batch (benchmarks/gpu_groups.py)
GPU_GROUP_COST = 1 << 20
_RUN_RATIO = 0.85  # sequences within this length ratio of a run's first are never split apart
_MAX_RUNS = 64  # more runs than this (an unsorted batch): one group


def attention_groups(lengths: Sequence[int], group_cost: int | None = None) -> list[tuple[int, int]]:
    """Split sequences ``0..B-1`` into groups of consecutive ones, ``[(first, stop), ...]``, that
    minimise the padded attention cost ``sum B_g * max(L)^2 + group_cost`` per group (exact over
    runs of similar length; the engine passes length-sorted batches, longest first).
    ``group_cost``: a group's overhead in query-key pairs (None: :data:`GROUP_COST`, the CPU's)."""
    group_cost = GROUP_COST if group_cost is None else group_cost
    b = len(lengths)
    width = max(lengths)
    padded = b * width * width
    if padded - sum(n * n for n in lengths) <= group_cost:
        return [(0, b)]
    runs = [0]  # starts of runs of similar length
    for i in range(1, b):
        if lengths[i] < _RUN_RATIO * lengths[runs[-1]] or lengths[i] > lengths[runs[-1]]:
            runs.append(i)
    if len(runs) > _MAX_RUNS:
        return [(0, b)]
    runs.append(b)
    r = len(runs) - 1
    longest = [max(lengths[runs[i] : runs[i + 1]]) for i in range(r)]
    # best[j]: the cheapest split of runs 0..j-1; groups are spans of whole runs
    best = [0.0] + [float("inf")] * r
    cut = [0] * (r + 1)
    for j in range(1, r + 1):
        top = 0
        for i in range(j - 1, -1, -1):  # the group = runs i..j-1
            top = max(top, longest[i])
            cost = best[i] + (runs[j] - runs[i]) * top * top + group_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds = []
    j = r
    while j > 0:
        bounds.append((runs[cut[j]], runs[j]))
        j = cut[j]
    return bounds[::-1]


def plan_groups(
    lengths: Sequence[int], device: torch.device, *, key_mask: bool
) -> tuple[torch.Tensor, list[AttentionGroup]]:
    """Each token's position within its own sequence ``(N,)``, and the batch's attention grids
    (:func:`attention_groups`): where each token sits in its group's grid and, with ``key_mask``,
    which keys are real (a causal grid needs none: padding comes after every real key)."""
    sizes = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    column = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) - np.repeat(starts, sizes)
    groups = []
    for first, stop in attention_groups(lengths, GPU_GROUP_COST if device.type == "cuda" else GROUP_COST):
        part = sizes[first:stop]
        width, start, end = int(part.max()), int(starts[first]), int(ends[stop - 1])
        flat = mask = None
        if (
            int(part.min()) < width
        ):  # padding in this group's grid: where each token sits, which keys are real
            row = np.repeat(np.arange(stop - first, dtype=np.int64), part)
            flat = _to_device(torch.from_numpy(row * width + column[start:end]), device)
            if key_mask:
                real = np.arange(width)[None, :] < part[:, None]
                mask = _to_device(torch.from_numpy(real[:, None, None, :]), device)
        groups.append(AttentionGroup(start, end, stop - first, width, flat, mask))
    return torch.from_numpy(column), groups


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without waiting: pinned first on a GPU (a copy from pageable memory
    would wait for the forward just launched)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def unpackable(config: Any) -> str | None:
    """What in ``config`` the packed forward cannot express exactly, or None when it can."""
    row = family(config.model_type)
    if row is None or row.forward != "bert":
        return f"model type {config.model_type!r}"
    if getattr(config, "position_embedding_type", "absolute") not in (None, "absolute"):
        return f"position_embedding_type {config.position_embedding_type!r}"
    if getattr(config, "is_decoder", False):
        return "a decoder"
    if getattr(config, "chunk_size_feed_forward", 0):
        return "chunked feed-forward"
    return None


class ResidentEncoder(Resident):
    """A BERT-layout encoder's layers with their weights in memory, as the layer loop runs them: the
    packed forward's embeddings and layer function (the streamed encoder runs the same two)."""

    def __init__(self, packed: PackedEncoder) -> None:
        self.packed = packed

    def embed(self, batch: PackedBatch, vocabulary: Any) -> torch.Tensor:
        return self.packed.embed(batch)

    def layer_step(self, depth: int) -> Any:
        layer, run = self.packed.layers[depth - 1], self.packed.run_layer
        return lambda hidden, batch, carried: run(layer, hidden, batch)


class PackedEncoder:
    """The packed forward of a Hugging Face BERT-family model, on the model's own modules."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.embeddings = model.embeddings
        self.project = getattr(model, "embeddings_project", None)  # ELECTRA: embedding -> hidden size
        self.layers = list(model.encoder.layer)
        self.n_heads: int = model.config.num_attention_heads
        self.first_position = first_position(model)  # RoBERTa's: after the padding row
        self._qkv: dict[int, tuple] = {}  # id(self-attention module) -> (versions, weight, bias)
        self.linear = PrepackedLinears()  # oneDNN on the CPU (cpu_gemm.py), else F.linear
        self._resident = ResidentEncoder(self)

    @classmethod
    def build(cls, model: Any) -> PackedEncoder | None:
        """A packed forward for ``model``, or None when it cannot express it exactly."""
        if unpackable(model.config):
            return None
        encoder = getattr(model, "encoder", None)
        if encoder is None or not hasattr(encoder, "layer") or not hasattr(model, "embeddings"):
            return None
        first = encoder.layer[0]
        needed = ("attention", "intermediate", "output")
        if not all(hasattr(first, name) for name in needed) or not hasattr(first.attention, "self"):
            return None
        # the layer's sub-modules are run op by op (_layer): they must have the standard parts
        residuals = (first.attention.output, first.output)
        if not all(hasattr(m, "dense") and hasattr(m, "LayerNorm") for m in residuals):
            return None
        if not hasattr(first.intermediate, "dense") or not callable(
            getattr(first.intermediate, "intermediate_act_fn", None)
        ):
            return None
        projections = [getattr(first.attention.self, n, None) for n in ("query", "key", "value")]
        if any(p is None or getattr(p, "bias", None) is None for p in projections):
            return None
        return cls(model)

    def prepare(self, columns: Any, *, with_token_types: bool, device: torch.device) -> PackedBatch:
        """The batch's index tensors from its columns (_inputs/block.py ``TokenColumns``: ids and
        type ids back to back, each input's length)."""
        lengths = columns.lengths
        ids = torch.from_numpy(columns.ids)
        if with_token_types and columns.type_ids is not None:
            types = torch.from_numpy(columns.type_ids)
        else:
            types = torch.zeros(len(ids), dtype=torch.long)
        column, groups = plan_groups(lengths, device, key_mask=True)
        positions = column + self.first_position
        ids, types, positions = (_to_device(t, device) for t in (ids, types, positions))
        return PackedBatch(ids, types, positions, lengths=lengths, groups=groups)

    def forward(self, batch: PackedBatch, layers: Sequence[int]) -> torch.Tensor:
        """Hidden states ``layers`` (0 = embeddings) of the packed batch: ``(len(layers), N, H)``,
        through the one layer loop (layer_loop.py) with the weights resident."""
        return run_block(self._resident, [batch], layers)[0]

    def embed(self, batch: PackedBatch) -> torch.Tensor:
        """Hidden state 0 of the packed batch, ``(N, H)``."""
        ids, types, positions = batch.ids[None], batch.types[None], batch.positions[None]
        h = self.embeddings(input_ids=ids, token_type_ids=types, position_ids=positions)[0]
        return self.project(h) if self.project is not None else h

    def forget(self, layer: Any) -> None:
        """Drop what was derived from ``layer``'s weights (the fused projections, prepacked copies):
        the streamed forward (streaming/forward.py) releases a layer's weights after each block."""
        self._qkv.pop(id(layer.attention.self), None)
        self.linear.forget()

    def run_layer(self, layer: Any, h: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """The layer's modules op for op as their forward runs them in eval mode (dropout is the
        identity), with the linear layers on self.linear."""
        context = self._attend(layer.attention.self, h, batch)
        a = self._residual(layer.attention.output, context, h)  # LayerNorm(dense(context) + h)
        intermediate = layer.intermediate
        inner = intermediate.intermediate_act_fn(self._dense(intermediate.dense, a))
        return self._residual(layer.output, inner, a)  # LayerNorm(dense(inner) + a)

    def _dense(self, module: Any, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x, module.weight, module.bias)

    def _residual(self, module: Any, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return module.LayerNorm(self._dense(module.dense, x) + skip)

    def _fused_qkv(self, module: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Query, key and value projections as one matrix (one larger matmul instead of three), cached
        per layer and rebuilt whenever any of the six tensors has changed (their version counters):
        weights edited in place after loading are never served stale."""
        parts = (
            module.query.weight,
            module.key.weight,
            module.value.weight,
            module.query.bias,
            module.key.bias,
            module.value.bias,
        )
        stamp = tuple((id(t), t._version) for t in parts)
        cached = self._qkv.get(id(module))
        if cached is None or cached[0] != stamp:
            cached = (stamp, torch.cat(parts[:3]), torch.cat(parts[3:]))
            self._qkv[id(module)] = cached
        return cached[1], cached[2]

    def _attend(self, module: Any, h: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        weight, bias = self._fused_qkv(module)
        qkv = self.linear(h, weight, bias)  # (N, 3H)
        if len(batch.groups) == 1:
            return self._attend_group(module, qkv, batch.groups[0])
        context = h.new_empty(h.shape)
        for group in batch.groups:
            context[group.start : group.stop] = self._attend_group(
                module, qkv[group.start : group.stop], group
            )
        return context

    def _attend_group(self, module: Any, qkv: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
        """Attention of one group's tokens ``(N_g, 3H)`` -> context ``(N_g, H)``."""
        b, t, heads = group.count, group.width, self.n_heads
        hidden = qkv.shape[1] // 3
        d = hidden // heads
        if group.flat is not None:  # one scatter of q, k and v together into the grid, zeros at padding
            grid = qkv.new_zeros(b * t, 3 * hidden)
            grid.index_copy_(0, group.flat, qkv)
            qkv = grid
        q, k, v = qkv.view(b, t, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)  # (B, heads, T, d) each
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=group.key_mask, scale=module.scaling)
        context = context.transpose(1, 2).reshape(b * t, hidden)
        return context if group.flat is None else context.index_select(0, group.flat)
