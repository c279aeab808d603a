"""How a layer-streamed model's batches run (_model/streaming/forward.py): gathered into blocks of
the plan's ``block_tokens`` real tokens, each block run layer by layer (each layer's weights read
once for the whole block), each layer's states reduced as the call wants them as soon as they are
computed (the final norm, the device pools), then each batch's rows handed on as the in-memory
forward hands them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from .._features.device_pool import batch_groups, finish, pool_groups
from .._inputs.block import TokenColumns
from .._model.final_norm import apply_final_norm
from .._model.forward.concurrent import ForwardLock
from .._model.forward.sdpa import attention_kernels
from .._model.streaming.forward import StreamedForward
from .call import Call
from .host_copy import RESULT_DTYPES, HostCopy
from .rows import Rows, packed_rows

if TYPE_CHECKING:
    from .packed_runs import Jobs, Launched

Key = TypeVar("Key")


@dataclass(frozen=True)
class BlockRunner:
    """The streamed ``forward`` on ``device``, each block under ``lock`` (alone: the weights are
    the block's). ``with_token_types``: the model reads segment ids."""

    forward: StreamedForward
    lock: ForwardLock
    device: torch.device
    with_token_types: bool

    def rows(self, jobs: Jobs[Key], call: Call) -> Iterator[tuple[Key, Rows]]:
        """Each batch's rows, in order, block by block."""
        block: list[tuple[Key, TokenColumns]] = []
        tokens = 0
        for key, columns in jobs:
            made = columns()
            block.append((key, made))
            tokens += int(sum(made.lengths))
            if tokens >= self.forward.plan.block_tokens:
                yield from self._block_rows(block, call)
                block, tokens = [], 0
        if block:
            yield from self._block_rows(block, call)

    def _block_rows(self, block: list[tuple[Key, TokenColumns]], call: Call) -> Iterator[tuple[Key, Rows]]:
        """One block through the streamed model. Each requested hidden state is reduced as soon as
        its layer is computed (the final norm, the call's pools), so the block holds the pooled rows
        of every layer, not every layer's states; on a GPU, unpooled states leave the device then."""
        forward, pooling, model = self.forward, call.device_pool, self.forward.model.skeleton
        columns = [c for _, c in block]
        prepared = [
            forward.prepare(c, with_token_types=self.with_token_types, device=self.device) for c in columns
        ]
        groups: list[Any] = [None] * len(columns)  # each batch's rows when pooled (batch_groups)

        def keep(i: int, depth: int, hidden: torch.Tensor) -> torch.Tensor:
            hidden = apply_final_norm(model, hidden[None], (depth,), call.final_norm)
            if pooling is None:
                return hidden[0] if hidden.device.type == "cpu" else hidden[0].to("cpu")
            if groups[i] is None:  # which tokens make which rows: once a batch, not once a layer
                groups[i] = batch_groups(columns[i], pooling)
            owner, _, n_rows, group_pool = groups[i]
            return pool_groups(hidden, owner, n_rows, group_pool)[0]

        with self.lock.exclusive(), torch.inference_mode(), attention_kernels(self.device):
            kept = forward.forward_block(prepared, call.layers, keep)
            launched: list[Launched] = []
            for batch, hidden, pooled_as in zip(columns, kept, groups, strict=True):
                sizes, owner = (batch.lengths, None) if pooled_as is None else (pooled_as[1], pooled_as[0])
                if pooling is not None:
                    hidden = finish(hidden, call.layers, pooling)
                launched.append((sizes, HostCopy(hidden, {}, RESULT_DTYPES[call.dtype]), owner))
        del kept, prepared
        for (key, _), rows in zip(block, launched, strict=True):
            yield key, packed_rows(*rows)
