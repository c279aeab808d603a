"""How the packed forward's batches run: one after the other; on a GPU one ahead (batch k+1 is
launched before batch k's rows are read, so the GPU computes while the host copies, host_copy.py);
on a CPU with concurrent forwards, a few batches ahead of the caller on their threads
(_model/forward/concurrent.py), who consumes the rows meanwhile."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from .._features.device_pool import finish, pool_batch
from .._inputs.block import TokenColumns
from .._model.final_norm import apply_final_norm
from .._model.forward.concurrent import ForwardLock, ForwardPool
from .._model.forward.sdpa import attention_kernels
from .call import Call
from .host_copy import RESULT_DTYPES, HostCopy
from .rows import Rows, packed_rows

if TYPE_CHECKING:  # the forwards this runs are built by the engine (engine.py), named here for types
    from .._model.forward.packed import PackedEncoder
    from .._model.forward.packed_decoder import PackedDecoder

Key = TypeVar("Key")
# a packed batch on its way to the host: each input's rows, the copy, pooled rows' token -> row map
Launched = tuple[list[int], HostCopy, np.ndarray | None]
Jobs = Iterable[tuple[Key, Callable[[], TokenColumns]]]


@dataclass(frozen=True)
class PackedRunner:
    """The packed ``forward`` of ``model`` (whose final norm the calls may ask for) on ``device``,
    its batches under ``lock`` (shared: packed forwards run side by side), on ``pool``'s threads
    when there is one. ``with_token_types``: the model reads segment ids."""

    forward: PackedEncoder | PackedDecoder
    model: Any
    lock: ForwardLock
    device: torch.device
    with_token_types: bool
    pool: ForwardPool | None = None

    def rows(self, jobs: Jobs[Key], call: Call) -> Iterator[tuple[Key, Rows]]:
        """Each batch's rows, in order, from ``(key, its columns)`` jobs."""
        if self.device.type == "cuda":
            return self._one_ahead(jobs, call)
        if self.pool is not None:
            return self._concurrently(jobs, call)
        return ((key, self.run(columns(), call)) for key, columns in jobs)

    def run(self, columns: TokenColumns, call: Call) -> Rows:
        """One batch's rows on the host."""
        return packed_rows(*self.launch(columns, call))

    def launch(self, columns: TokenColumns, call: Call) -> Launched:
        """The batch's packed forward, launched, and its results on their way to the host."""
        forward: Any = self.forward  # each forward reads the batch its own prepare made
        batch = forward.prepare(columns, with_token_types=self.with_token_types, device=self.device)
        with self.lock.shared(), torch.inference_mode(), attention_kernels(self.device):
            tapped: dict[str, torch.Tensor] = {}
            if call.taps:  # (L, N, H), and {tap: (L', N, H)}: real tokens only (a decoder's)
                hidden, tapped = forward.forward_with_taps(batch, call.layers, call.taps)
            else:
                hidden = forward.forward(batch, call.layers)
            return self._to_host(hidden, tapped, columns, call)

    def _to_host(self, hidden: torch.Tensor, tapped: dict, columns: TokenColumns, call: Call) -> Launched:
        """A batch's hidden states ``(L, N, H)`` as the call wants them, on their way to the host: the
        final norm, the device pools (only the pooled rows cross), the copy in the result's dtype."""
        hidden = apply_final_norm(self.model, hidden, call.layers, call.final_norm)
        sizes, owner = columns.lengths, None
        if call.device_pool is not None:
            pooled, sizes, owner = pool_batch(hidden, columns, call.device_pool)
            hidden = finish(pooled, call.layers, call.device_pool)
        return sizes, HostCopy(hidden, tapped, RESULT_DTYPES[call.dtype]), owner

    def _one_ahead(self, jobs: Jobs[Key], call: Call) -> Iterator[tuple[Key, Rows]]:
        """Batch k+1 launched before batch k is read."""
        waiting: tuple[Key, Launched] | None = None
        for key, columns in jobs:
            try:
                launched = (key, self.launch(columns(), call))
            except Exception:  # the batches before it are handed out first
                if waiting is not None:
                    yield waiting[0], packed_rows(*waiting[1])
                raise
            if waiting is not None:
                yield waiting[0], packed_rows(*waiting[1])
            waiting = launched
        if waiting is not None:
            yield waiting[0], packed_rows(*waiting[1])

    def _concurrently(self, jobs: Jobs[Key], call: Call) -> Iterator[tuple[Key, Rows]]:
        """As many batches running as the pool has forwards, one more waiting."""
        assert self.pool is not None
        ahead: deque[tuple[Key, Future]] = deque()
        try:
            for key, columns in jobs:
                ahead.append((key, self.pool.submit(lambda c=columns: self.run(c(), call))))
                if len(ahead) > self.pool.forwards:
                    key, future = ahead.popleft()
                    yield key, future.result()
            while ahead:
                key, future = ahead.popleft()
                yield key, future.result()
        finally:  # the caller stopped early or a batch failed: drop the batches not started
            for _, future in ahead:
                future.cancel()
