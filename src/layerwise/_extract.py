"""The engine: batches of encoded inputs in, a stream of LayerStacks out.

:class:`Engine` cuts long inputs into windows, groups inputs into length-sorted batches under a
padded-token budget, runs :func:`forward_batch` on each and stitches windows back together.

Two ways to collect hidden states, which agree exactly (a test checks it):

* ``"hidden_states"``: the model's own ``output_hidden_states=True``;
* ``"hooks"``: forward hooks on each encoder layer, the way many tutorials do it.

Either way the encoder is cut after the deepest requested layer (:func:`truncated_encoder`), and
sub-layer taps are recorded with hooks. The packed forward (packed.py) gives the same hidden states
without padding; on a CPU its batches run on concurrent streams (streams.py). Results come back
as :class:`LayerStack`, one per input.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import nullcontext
from typing import Any, TypeVar

import numpy as np
import torch

from ._batch_runs import one_ahead, streamed_rows
from ._call import Call
from ._features.device_pool import finish, pool_batch
from ._inputs.batches import length_sorted_batches
from ._inputs.block import EncodedBlock, EncodedInput, TokenColumns
from ._inputs.windows import Window, plan_windows
from ._model.decoders import apply_final_norm, is_decoder_config
from ._model.handle import ModelHandle
from ._model.hooks import eager_attention_for, find_layer_list
from ._model.host_copy import RESULT_DTYPES, HostCopy
from ._model.packed_decoder import PACKED_TAPS, PackedDecoder, packed_forward
from ._model.padded import collate, forward_batch, warm_up
from ._model.sdpa import attention_kernels
from ._model.streams import ForwardLock, ForwardPool, check_streams
from ._progress import progress_bar
from ._results import LayerStack
from ._rows import (
    Rows,
    block_stacks,
    check_overflow,
    make_stack,
    nonfinite_error,
    packed_rows,
    split_rows,
    stitch_stack,
    warn_nonfinite,
)
from ._settings import FinalNorm, Method, Settings
from .errors import OptionError

logger = logging.getLogger("layerwise")
Key = TypeVar("Key")
# a packed batch on its way to the host: each input's rows, the copy, pooled rows' token -> row map
Launched = tuple[list[int], HostCopy, np.ndarray | None]


def _resolved(settings: Settings, name: str) -> int:
    value = getattr(settings, name)
    if value is None:  # a bug, never the user's: the Encoder fills these in for its model and device
        raise AssertionError(f"the engine takes resolved settings; {name} is None")
    return int(value)


class Engine:
    """The extraction loop: inputs (or their windows) in length-sorted batches under a token
    budget, the forward pass cut at the deepest requested layer, windows stitched back, results
    streamed as ``(input index, LayerStack)`` as batches finish (longest first)."""

    def __init__(self, models: ModelHandle, tokenizer: Any, settings: Settings) -> None:
        """``settings`` resolved for this model and device (Encoder: device, max_length, batch_size and
        max_tokens filled in): the engine reads them from there."""
        config, self.settings, self.allow_nan = models.config, settings, settings.allow_nan
        pad_id = tokenizer.pad_token_id
        self.models, self.device = models, torch.device(settings.device)
        self.max_length = _resolved(settings, "max_length")
        self.pad_id: int = pad_id if pad_id is not None else (getattr(config, "pad_token_id", None) or 0)
        # a light model stands only for types whose transformers forward takes token_type_ids
        forward = models.current.forward if models.built else None
        accepts_types = forward is None or "token_type_ids" in inspect.signature(forward).parameters
        self.with_token_types = accepts_types and getattr(config, "type_vocab_size", 0) >= 2
        self.batch_size, self.max_tokens = (_resolved(settings, n) for n in ("batch_size", "max_tokens"))
        self.model_type: str = config.model_type
        self.causal = is_decoder_config(config)  # windows keep each token's left context (windows.py)
        self._warm_up_ids = [tokenizer.cls_token_id or 0, tokenizer.sep_token_id or 0]
        # packed forwards share the model; a Hugging Face one (hooks, truncation patch it) runs alone
        self.lock = ForwardLock()
        # the unpadded forward where the architecture allows it (packed.py, packed_decoder.py); None:
        # Hugging Face's padded one
        # a streamed model (streaming=True) runs block by block, layer by layer (_batch_runs.py)
        self.streamed, self.stream_block_tokens = models.streamed, settings.stream_block_tokens or 0
        self.packed = models.streamed or (packed_forward(models.current) if settings.packed else None)
        streams = check_streams(settings.streams, self.device, config.hidden_size)
        self.pool = ForwardPool(streams) if streams > 1 and self.packed is not None else None
        if self.streamed is not None:  # a block's batches run each layer on the same streams
            self.streamed.pool = self.pool
        if models.built:
            self._adopt(models.current)
        else:
            models.on_transformers(self._adopt)

    @property
    def model(self) -> Any:
        """The transformers model (built on first use: see _model/handle.py)."""
        return self.models.transformers()

    def _adopt(self, model: Any) -> None:
        """The transformers model exists: find its layers, warm it up, and run the packed forward on
        its own modules from now on (weights edited through it are then the weights of every path)."""
        with self.lock.exclusive():
            self.layer_owner, self.layer_attr, self.layer_list = find_layer_list(
                model, model.config.num_hidden_layers
            )
            warm_up(model, self._warm_up_ids, self.device, self.models.name)
            if self.packed is not None:
                self.packed = packed_forward(model)

    def stream(
        self, encoded: list[EncodedInput], call: Call, progress: bool | None = None
    ) -> Iterator[tuple[int, LayerStack]]:
        """Per-input objects (the server's merged requests, windows, the padded forward) through the
        forward: ``(input index, LayerStack)`` as batches finish. Units and batches are planned now
        (so bad input fails here) and run lazily."""
        call.check_batching()
        units: list[EncodedInput | Window] = []
        owners: list[tuple[int, int]] = []  # per unit: (input index, window number or -1)
        n_windows: dict[int, int] = {}
        for item in encoded:
            if len(item) <= self.max_length:
                units.append(item)
                owners.append((item.index, -1))
                continue
            if "attention_probs" in call.taps:
                raise OptionError(
                    f"attention_probs cannot be stitched across windows (input {item.index} has "
                    f"{len(item)} tokens > {self.max_length}); use long_texts='truncate' for attention maps"
                )
            windows = plan_windows(item, self.max_length, call.stride, causal=self.causal)
            n_windows[item.index] = len(windows)
            for k, window in enumerate(windows):
                units.append(window)
                owners.append((item.index, k))
        packed = self._runs_packed(call.method, call.taps)
        batches = self._plan_batches([len(u) for u in units], call, packed)
        if not (packed and not n_windows and not call.taps):
            call = dataclasses.replace(call, device_pool=None)
        return _unit_stacks(self, encoded, units, owners, n_windows, batches, call, progress)

    def blockwise(self, call: Call) -> bool:
        """Whether ``call`` runs on :meth:`stream_blocks`: the packed forward, no taps, no windows."""
        return self._runs_packed(call.method, call.taps) and not call.taps and call.long_texts != "window"

    def stream_blocks(
        self,
        blocks: Iterable[EncodedBlock],
        call: Call,
        progress: bool | None = None,
        total: int | None = None,
    ) -> Iterator[tuple[EncodedBlock, np.ndarray, Rows]]:
        """Blocks of tokenised inputs through the packed forward, one batch at a time: ``(block, rows
        of the block in this batch, their Rows)``. No per-input object is made: a batch is a gather
        of the block's columns, its states (or pooled rows) one host array. ``total``: the inputs of
        all blocks, for the progress bar. Needs :meth:`blockwise`."""
        call.check_batching()

        def jobs() -> Iterator[tuple[tuple[EncodedBlock, np.ndarray], Callable[[], TokenColumns]]]:
            source, nothing = iter(blocks), np.zeros(0, np.int64)
            while True:
                try:
                    block = next(source)
                except StopIteration:
                    return
                except Exception as exc:  # a later block's bad input: raised at its turn, not ahead
                    yield (None, nothing), functools.partial(_raise, exc)  # type: ignore[misc]
                    return
                for batch in self._plan_batches(block.lengths.tolist(), call, True):
                    rows = np.asarray(batch, dtype=np.int64)
                    yield (block, rows), functools.partial(block.columns, rows)

        quiet = progress is None and (total or 0) <= self.batch_size
        bar = None if quiet else progress_bar("extracting", "inputs", progress)
        task = bar.add_task("extract", total=total) if bar is not None else None
        nonfinite: list[int] = []  # inputs whose states hold NaN or inf (kept: allow_nan)
        with bar if bar is not None else nullcontext():
            for (block, rows), out in self._batch_rows(jobs(), call, packed=True):
                if out.nonfinite:
                    bad = [k for k, (hidden, _) in enumerate(out) if not np.isfinite(hidden).all()]
                    if bad and not self.allow_nan:
                        i = int(rows[bad[0]])  # the first input, named
                        raise nonfinite_error(block.first + i, block.texts[i], out[bad[0]][0], call.layers)
                    nonfinite += [block.first + int(rows[k]) for k in bad]
                check_overflow(out, block.first + rows, call.layers)
                yield block, rows, out
                if bar is not None and task is not None:
                    bar.advance(task, len(rows))
        if nonfinite:
            warn_nonfinite(nonfinite)

    def block_stream(
        self,
        blocks: Iterable[EncodedBlock],
        call: Call,
        progress: bool | None = None,
        total: int | None = None,
    ) -> Iterator[tuple[int, LayerStack]]:
        """:meth:`stream_blocks` as ``(input index, LayerStack)``: each stack's arrays are views of its
        batch's and block's (one copy per batch)."""
        pooled = None if call.device_pool is None else call.device_pool.level
        for block, rows, out in self.stream_blocks(blocks, call, progress, total):
            yield from block_stacks(block, rows, out, call.layers, pooled)

    def _plan_batches(self, lengths: list[int], call: Call, packed: bool) -> list[list[int]]:
        budget = call.max_tokens or self.max_tokens
        if packed and self.pool is not None and lengths:
            # fewer batches than streams would leave a stream idle (a server's run of a few short
            # requests fits one batch): split the tokens evenly, in at most that many batches
            budget = min(budget, -(-sum(lengths) // self.pool.streams) + max(lengths))
        return length_sorted_batches(lengths, call.batch_size or self.batch_size, budget, padded=not packed)

    def forward_units(
        self,
        units: Sequence[Any],
        *,
        layers: tuple[int, ...],
        final_norm: FinalNorm,
        taps: tuple[str, ...] = (),
    ) -> Iterator[tuple[list[int], Rows]]:
        """Sequences that need no windows (``.ids``, ``.type_ids``, ``len``: the cache's contexts) through
        the forward: ``(unit indices, Rows)`` per batch; the same units give the same batches (bytes)."""
        packed = self._runs_packed("hidden_states", taps)  # else the taps need Hugging Face's forward
        call = Call(layers, "hidden_states" if packed else "hooks", taps, final_norm=final_norm)
        lengths = [len(u) for u in units]
        batches = length_sorted_batches(lengths, self.batch_size, self.max_tokens, padded=not packed)
        return self._batch_rows(_unit_jobs(list(units), batches, packed), call, packed=packed)

    def _batch_rows(
        self, jobs: Iterable[tuple[Key, Callable[[], Any]]], call: Call, *, packed: bool
    ) -> Iterator[tuple[Key, Rows]]:
        """Each batch's rows, in order, from ``(key, its input)`` jobs; on the forward pool's streams
        when it has one (a few batches ahead of the caller, who consumes the rows meanwhile); on a
        GPU one batch ahead; a streamed model block by block."""
        if packed and self.streamed is not None:
            yield from streamed_rows(self, jobs, call)
            return
        if packed and self.device.type == "cuda":
            yield from one_ahead(self, jobs, call)
            return
        if self.pool is None or not packed:
            forward = self._forward_packed if packed else self._forward_padded
            for key, batch in jobs:
                yield key, forward(batch(), call)
            return
        ahead: deque[tuple[Key, Future]] = deque()
        try:
            for key, columns in jobs:
                ahead.append((key, self.pool.submit(lambda c=columns: self._forward_packed(c(), call))))
                if len(ahead) > self.pool.streams:
                    key, future = ahead.popleft()
                    yield key, future.result()
            while ahead:
                key, future = ahead.popleft()
                yield key, future.result()
        finally:  # the caller stopped early or a batch failed: drop the batches not started
            for _, future in ahead:
                future.cancel()

    def _forward_padded(self, units: Sequence[EncodedInput | Window], call: Call) -> Rows:
        model = self.model  # built (and adopted) before the lock is taken
        batch = collate(units, pad_id=self.pad_id, with_token_types=self.with_token_types, device=self.device)
        kernels = attention_kernels(self.device)  # no cuDNN attention: it plans each new shape (sdpa.py)
        with self.lock.exclusive(), torch.inference_mode(), eager_attention_for(model, call.taps), kernels:
            hidden, tapped = forward_batch(
                model, batch, layers=call.layers, method=call.method, layer_owner=self.layer_owner,
                layer_attr=self.layer_attr, layer_list=self.layer_list, model_type=self.model_type,
                taps=call.taps,
            )  # fmt: skip
            hidden = apply_final_norm(model, hidden, call.layers, call.final_norm)
        return split_rows(HostCopy(hidden, tapped, RESULT_DTYPES[call.dtype]), [len(u) for u in units])

    def _runs_packed(self, method: Method, taps: tuple[str, ...]) -> bool:
        """The packed forward gives hidden states, and a decoder's attn_out and mlp_out: other taps
        and hooks need the Hugging Face modules' own forward. The batching (real or padded token
        budget) follows the same choice."""
        if self.packed is None or method != "hidden_states":
            return False
        return not taps or (isinstance(self.packed, PackedDecoder) and set(taps) <= set(PACKED_TAPS))

    def _forward_packed(self, columns: TokenColumns, call: Call) -> Rows:
        return packed_rows(*self.launch_packed(columns, call))

    def launch_packed(self, columns: TokenColumns, call: Call) -> Launched:
        """The batch's packed forward, launched, and its results on their way to the host."""
        packed: Any = self.packed  # one packed forward for the whole batch (_adopt may replace it)
        assert packed is not None
        batch = packed.prepare(columns, with_token_types=self.with_token_types, device=self.device)
        with self.lock.shared(), torch.inference_mode(), attention_kernels(self.device):
            tapped: dict[str, torch.Tensor] = {}
            if call.taps:  # (L, N, H), and {tap: (L', N, H)}: real tokens only
                hidden, tapped = packed.forward_with_taps(batch, call.layers, call.taps)
            else:
                hidden = packed.forward(batch, call.layers)
            return self.to_host(hidden, tapped, columns, call)

    def to_host(self, hidden: torch.Tensor, tapped: dict, columns: TokenColumns, call: Call) -> Launched:
        """A batch's hidden states ``(L, N, H)`` as the call wants them, on their way to the host: the
        final norm, the device pools (only the pooled rows cross), the copy in the result's dtype."""
        hidden = apply_final_norm(self.models.current, hidden, call.layers, call.final_norm)
        sizes, owner = columns.lengths, None
        if call.device_pool is not None:
            pooled, sizes, owner = pool_batch(hidden, columns, call.device_pool)
            hidden = finish(pooled, call.layers, call.device_pool)
        return sizes, HostCopy(hidden, tapped, RESULT_DTYPES[call.dtype]), owner


def _unit_stacks(
    engine: Engine,
    encoded: list[EncodedInput],
    units: list[EncodedInput | Window],
    owners: list[tuple[int, int]],
    n_windows: dict[int, int],
    batches: list[list[int]],
    call: Call,
    progress: bool | None,
) -> Iterator[tuple[int, LayerStack]]:
    layers = call.layers
    by_index = {item.index: item for item in encoded}
    quiet = progress is None and len(batches) <= 1
    bar = None if quiet else progress_bar("extracting", "inputs", progress)
    task = bar.add_task("extract", total=len(units)) if bar is not None else None
    pending: dict[int, dict[int, tuple]] = {}  # windows of long inputs until all are done
    nonfinite: list[int] = []  # inputs whose vectors hold NaN or inf
    packed = engine._runs_packed(call.method, call.taps)
    with bar if bar is not None else nullcontext():
        for batch_ids, rows in engine._batch_rows(_unit_jobs(units, batches, packed), call, packed=packed):
            if rows.overflows:
                check_overflow(rows, [owners[u][0] for u in batch_ids], layers)
            for u, (hidden, tapped) in zip(batch_ids, rows, strict=True):
                index, k = owners[u]
                if rows.nonfinite and not np.isfinite(hidden).all():
                    if not engine.allow_nan:
                        raise nonfinite_error(index, by_index[index].text, hidden, layers)
                    nonfinite.append(index)
                if k < 0:  # pooled on the device: the rows are the input's pooled vectors
                    pooled = None if call.device_pool is None else hidden[:, 0] if call.sentence else hidden
                    yield index, make_stack(by_index[index], hidden, tapped, layers, pooled=pooled)
                    continue
                pending.setdefault(index, {})[k] = (units[u], hidden, tapped)
                if len(pending[index]) == n_windows[index]:
                    yield index, stitch_stack(by_index[index], pending.pop(index), layers)
            if bar is not None and task is not None:
                bar.advance(task, len(batch_ids))
    if nonfinite:
        warn_nonfinite(nonfinite)


def _unit_jobs(
    units: list[Any], batches: list[list[int]], packed: bool
) -> Iterator[tuple[list[int], Callable]]:
    """Each batch's unit indices and what its forward reads: the units' columns (packed) or the
    units themselves (the padded forward collates them)."""
    for batch_ids in batches:
        picked = [units[u] for u in batch_ids]
        yield (
            batch_ids,
            (lambda picked=picked: TokenColumns.of_units(picked))
            if packed
            else (lambda picked=picked: picked),
        )


def _raise(exc: BaseException) -> Any:
    raise exc
