"""How the engine's packed batches run where they do not simply run one after the other:

- on a GPU, one ahead: batch k+1 is launched before batch k's rows are read, so the GPU computes
  while the host copies (_model/host_copy.py);
- on a layer-streamed model (_model/streamed.py), block by block: batches gathered into blocks of
  ``stream_block_tokens`` real tokens, each block run layer by layer (each layer's weights read once
  for the whole block), then each batch's rows handed on as the in-memory forward hands them (the
  final norm, the device pools, the copy to the host: ``Engine.to_host``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

from ._call import Call
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
    streamed = engine.packed
    prepared = [
        streamed.prepare(c, with_token_types=engine.with_token_types, device=engine.device) for _, c in block
    ]
    with engine.lock.exclusive(), torch.inference_mode(), attention_kernels(engine.device):
        hidden = streamed.forward_block(prepared, call.layers)
        launched = [
            engine.to_host(h, {}, columns, call) for h, (_, columns) in zip(hidden, block, strict=True)
        ]
    del hidden, prepared
    for (key, _), rows in zip(block, launched, strict=True):
        yield key, packed_rows(*rows)
