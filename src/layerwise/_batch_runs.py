"""How the engine's packed batches run where they do not simply run one after the other:

- on a GPU, one ahead: batch k+1 is launched before batch k's rows are read, so the GPU computes
  while the host copies (_model/host_copy.py);
- on a layer-streamed model (_model/streamed.py), block by block: batches gathered into blocks of
  ``stream_block_tokens`` real tokens, each block run layer by layer (each layer's weights read once
  for the whole block), each layer's states reduced as the call wants them as soon as they are
  computed (the final norm, the device pools), then each batch's rows handed on as the in-memory
  forward hands them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

from ._call import Call
from ._features.device_pool import batch_groups, finish, pool_groups
from ._model.decoders import apply_final_norm
from ._model.host_copy import RESULT_DTYPES, HostCopy
from ._model.sdpa import attention_kernels
from ._rows import Rows, packed_rows

Key = TypeVar("Key")


def one_ahead(
    engine: Any, jobs: Iterable[tuple[Key, Callable[[], Any]]], call: Call
) -> Iterator[tuple[Key, Rows]]:
    """Each batch's rows, in order, batch k+1 launched before batch k is read."""
    waiting: tuple[Key, Any] | None = None
    for key, columns in jobs:
        try:
            launched = (key, engine.launch_packed(columns(), call))
        except Exception:  # the batches before it are handed out first
            if waiting is not None:
                yield waiting[0], packed_rows(*waiting[1])
            raise
        if waiting is not None:
            yield waiting[0], packed_rows(*waiting[1])
        waiting = launched
    if waiting is not None:
        yield waiting[0], packed_rows(*waiting[1])


def streamed_rows(
    engine: Any, jobs: Iterable[tuple[Key, Callable[[], Any]]], call: Call
) -> Iterator[tuple[Key, Rows]]:
    """Each batch's rows, in order, block by block."""
    block: list[tuple[Key, Any]] = []
    tokens = 0
    for key, columns in jobs:
        made = columns()
        block.append((key, made))
        tokens += int(sum(made.lengths))
        if tokens >= engine.stream_block_tokens:
            yield from _block_rows(engine, block, call)
            block, tokens = [], 0
    if block:
        yield from _block_rows(engine, block, call)


def _block_rows(engine: Any, block: list[tuple[Key, Any]], call: Call) -> Iterator[tuple[Key, Rows]]:
    """One block through the streamed model. Each requested hidden state is reduced as soon as its
    layer is computed (the final norm, the call's pools), so the block holds the pooled rows of
    every layer, not every layer's states; on a GPU, unpooled states leave the device then."""
    streamed, pooling, current = engine.packed, call.device_pool, engine.models.current
    columns = [c for _, c in block]
    prepared = [
        streamed.prepare(c, with_token_types=engine.with_token_types, device=engine.device) for c in columns
    ]
    groups: list[Any] = [None] * len(columns)  # each batch's rows when pooled (batch_groups)

    def keep(i: int, depth: int, hidden: torch.Tensor) -> torch.Tensor:
        hidden = apply_final_norm(current, hidden[None], (depth,), call.final_norm)
        if pooling is None:
            return hidden[0] if hidden.device.type == "cpu" else hidden[0].to("cpu")
        if groups[i] is None:  # which tokens make which rows: once a batch, not once a layer
            groups[i] = batch_groups(columns[i], pooling)
        owner, _, n_rows, group_pool = groups[i]
        return pool_groups(hidden, owner, n_rows, group_pool)[0]

    with engine.lock.exclusive(), torch.inference_mode(), attention_kernels(engine.device):
        kept = streamed.forward_block(prepared, call.layers, keep)
        launched = []
        for batch, hidden, pooled_as in zip(columns, kept, groups, strict=True):
            sizes, owner = (batch.lengths, None) if pooled_as is None else (pooled_as[1], pooled_as[0])
            if pooling is not None:
                hidden = finish(hidden, call.layers, pooling)
            launched.append((sizes, HostCopy(hidden, {}, RESULT_DTYPES[call.dtype]), owner))
    del kept, prepared
    for (key, _), rows in zip(block, launched, strict=True):
        yield key, packed_rows(*rows)
