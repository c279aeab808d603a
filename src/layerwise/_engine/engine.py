"""The engine: batches of encoded inputs in, each batch's rows on the host out.

:class:`Engine` cuts long inputs into windows, groups inputs into length-sorted batches under a
token budget, runs each batch through the forward and hands on its rows: the packed forward's
(packed_runs.py), a layer-streamed model's block by block (blocks.py), or Hugging Face's padded
forward, cut at the deepest requested layer, with hooks for sub-layer taps. Per-input results
(windows stitched back) are made in units.py; a block's batches stay arrays (rows.py).

Two ways to collect hidden states, which agree exactly (a test checks it):

* ``"hidden_states"``: the model's own ``output_hidden_states=True``;
* ``"hooks"``: forward hooks on each encoder layer, the way many tutorials do it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from typing import Any, Literal, TypeVar

import numpy as np
import torch

from .._host.progress import progress_bar
from .._inputs.batches import length_sorted_batches, one_length_batches
from .._inputs.block import EncodedBlock, EncodedInput, TokenColumns
from .._inputs.windows import Window
from .._model.families.kinds import is_decoder_config
from .._model.final_norm import apply_final_norm
from .._model.forward.concurrent import ForwardLock, ForwardPool, check_forwards
from .._model.forward.general import GeneralForward
from .._model.forward.packed import PackedEncoder
from .._model.forward.packed_decoder import PACKED_TAPS, PackedDecoder, packed_forward
from .._model.forward.padded import collate, forward_batch
from .._model.forward.replica import model_state, users_hooks
from .._model.forward.sdpa import attention_kernels
from .._model.handle import ModelHandle
from .._model.streaming.forward import StreamedForward
from .._model.streaming.plan import StreamPlan
from .._results import LayerStack
from .._settings.settings import FinalNorm, Method, Settings
from .blocks import BlockRunner
from .call import Call
from .host_copy import RESULT_DTYPES, HostCopy
from .packed_runs import PackedRunner
from .rows import Rows, block_stacks, check_overflow, nonfinite_error, split_rows, warn_nonfinite
from .units import planned_units, unit_jobs, unit_stacks

logger = logging.getLogger("layerwise")
Key = TypeVar("Key")
RunPath = Literal["packed", "streamed", "general"]


def _resolved(settings: Settings, name: str) -> int:
    value = getattr(settings, name)
    if value is None:  # a bug, never the user's: the Encoder fills these in for its model and device
        raise AssertionError(f"the engine takes resolved settings; {name} is None")
    return int(value)


class Engine:
    """The extraction loop: inputs (or their windows) in length-sorted batches under a token
    budget, the forward pass cut at the deepest requested layer, windows stitched back, results
    streamed as ``(input index, LayerStack)`` as batches finish (longest first)."""

    def __init__(
        self, models: ModelHandle, tokenizer: Any, settings: Settings, stream_plan: StreamPlan | None = None
    ) -> None:
        """``settings`` resolved for this model and device (Encoder: device, max_length, batch_size and
        max_tokens filled in): the engine reads them from there. ``stream_plan``: how a
        layer-streamed model's blocks run (_model/streaming/plan.py)."""
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
        # packed forwards share the model; a Hugging Face one (its replica cut, hooked) runs alone
        self.lock = ForwardLock()
        # what runs the batches: the unpadded forward where the architecture allows it
        # (forward/packed.py, forward/packed_decoder.py), a layer-streamed model block by block as
        # its plan says, or None: Hugging Face's padded forward
        streamed_model = models.streamed
        packed = packed_forward(models.current) if settings.packed and streamed_model is None else None
        forwards = check_forwards(settings.concurrent_forwards, self.device, config.hidden_size)
        runs_packed = packed is not None or streamed_model is not None
        self.pool = ForwardPool(forwards) if forwards > 1 and runs_packed else None
        self.runner: PackedRunner | BlockRunner | None = None
        if streamed_model is not None:
            assert stream_plan is not None, "a streamed model runs as its plan says"
            streamed = StreamedForward(streamed_model, stream_plan, self.pool)
            self.runner = BlockRunner(streamed, self.lock, self.device, self.with_token_types)
        elif packed is not None:
            self.runner = self._packed_runner(packed, models.current)
        if models.built:
            self._adopt(models.current)
        else:
            models.on_transformers(self._adopt)

    @property
    def model(self) -> Any:
        """The transformers model (built on first use: see _model/handle.py)."""
        return self.models.transformers()

    @property
    def packed(self) -> PackedEncoder | PackedDecoder | None:
        """The in-memory packed forward, when it runs the batches."""
        return self.runner.forward if isinstance(self.runner, PackedRunner) else None

    @property
    def streamed(self) -> StreamedForward | None:
        """The layer-streamed forward, when the model is streamed."""
        return self.runner.forward if isinstance(self.runner, BlockRunner) else None

    @property
    def path(self) -> RunPath:  # "general": transformers' own forward of padded batches (docs/models.md)
        if self.streamed is not None:
            return "streamed"
        return "packed" if self.packed is not None else "general"

    def _packed_runner(self, forward: Any, model: Any) -> PackedRunner:
        return PackedRunner(forward, model, self.lock, self.device, self.with_token_types, self.pool)

    def _adopt(self, model: Any) -> None:
        """The transformers model exists: find its layers, warm it up, and run the packed forward on
        its own modules from now on (weights edited through it are then the weights of every path)."""
        with self.lock.exclusive():
            ids, name = self._warm_up_ids, self.models.name
            self.general = GeneralForward(model, ids, self.pad_id, self.device, name)
            if self.packed is not None:  # a packed forward on the new modules (one, as before)
                forward = packed_forward(model)
                self.runner = None if forward is None else self._packed_runner(forward, model)

    def run_inputs(
        self, encoded: list[EncodedInput], call: Call, progress: bool | None = None
    ) -> Iterator[tuple[int, LayerStack]]:
        """Per-input objects (the server's merged requests, windows, the padded forward) through the
        forward: ``(input index, LayerStack)`` as batches finish. Units and batches are planned now
        (so bad input fails here) and run lazily."""
        call.check_batching()
        planned = planned_units(encoded, call, self.max_length, causal=self.causal)
        packed = self.runs_packed(call.method, call.taps)
        batches = self.plan_batches([len(u) for u in planned.units], call, packed)
        if not (packed and not planned.n_windows and not call.taps):
            call = dataclasses.replace(call, device_pool=None)
        rows = self._batch_rows(unit_jobs(planned.units, batches, packed), call, packed=packed)
        quiet = progress is None and len(batches) <= 1
        return unit_stacks(planned, rows, call, allow_nan=self.allow_nan, quiet=quiet, progress=progress)

    def blockwise(self, call: Call) -> bool:
        """Whether ``call`` runs on :meth:`run_blocks`: the packed forward, no taps, no windows."""
        return self.runs_packed(call.method, call.taps) and not call.taps and call.long_texts != "window"

    def run_blocks(
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
        quiet = progress is None and (total or 0) <= self.batch_size
        bar = None if quiet else progress_bar("extracting", "inputs", progress)
        task = bar.add_task("extract", total=total) if bar is not None else None
        nonfinite: list[int] = []  # inputs whose states hold NaN or inf (kept: allow_nan)
        with bar if bar is not None else nullcontext():
            for (block, rows), out in self._batch_rows(self._block_jobs(blocks, call), call, packed=True):
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

    def _block_jobs(
        self, blocks: Iterable[EncodedBlock], call: Call
    ) -> Iterator[tuple[tuple[EncodedBlock, np.ndarray], Callable[[], TokenColumns]]]:
        """Each batch of each block: ``((block, its rows), what gathers its columns)``; a later
        block's bad input is raised at its turn, after the batches before it."""
        source, nothing = iter(blocks), np.zeros(0, np.int64)
        while True:
            try:
                block = next(source)
            except StopIteration:
                return
            except Exception as exc:  # a later block's bad input: raised at its turn, not ahead
                yield (None, nothing), functools.partial(_raise, exc)  # type: ignore[misc]
                return
            for batch in self.plan_batches(block.lengths.tolist(), call, True):
                rows = np.asarray(batch, dtype=np.int64)
                yield (block, rows), functools.partial(block.columns, rows)

    def run_block_stacks(
        self,
        blocks: Iterable[EncodedBlock],
        call: Call,
        progress: bool | None = None,
        total: int | None = None,
    ) -> Iterator[tuple[int, LayerStack]]:
        """:meth:`run_blocks` as ``(input index, LayerStack)``: each stack's arrays are views of its
        batch's and block's (one copy per batch)."""
        pooled = None if call.device_pool is None else call.device_pool.level
        for block, rows, out in self.run_blocks(blocks, call, progress, total):
            yield from block_stacks(block, rows, out, call.layers, pooled)

    def plan_batches(self, lengths: list[int], call: Call, packed: bool) -> list[list[int]]:
        """Length-sorted batches of ``lengths`` under the call's (else the engine's) token budget:
        real tokens for the packed forward, padded ones for the padded forward."""
        budget = call.max_tokens or self.max_tokens
        if packed and self.pool is not None and lengths:
            # fewer batches than forwards would leave one idle (a server's run of a few short
            # requests fits one batch): split the tokens evenly, in at most that many batches
            budget = min(budget, -(-sum(lengths) // self.pool.forwards) + max(lengths))
        batches = length_sorted_batches(
            lengths, call.batch_size or self.batch_size, budget, padded=not packed
        )
        return batches if packed else self._as_padded(batches, lengths)

    def _as_padded(self, batches: list[list[int]], lengths: list[int]) -> list[list[int]]:
        """Padded batches as this model takes them: of one length each where padding changes its
        states (forward/padded.py)."""
        self.models.transformers()  # built and warmed up: its reading settled
        return batches if self.general.reading.exact_padding else one_length_batches(batches, lengths)

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
        packed = self.runs_packed("hidden_states", taps)  # else the taps need Hugging Face's forward
        call = Call(layers, "hidden_states" if packed else "hooks", taps, final_norm=final_norm)
        lengths = [len(u) for u in units]
        batches = length_sorted_batches(lengths, self.batch_size, self.max_tokens, padded=not packed)
        batches = batches if packed else self._as_padded(batches, lengths)
        return self._batch_rows(unit_jobs(list(units), batches, packed), call, packed=packed)

    def _batch_rows(
        self, jobs: Iterable[tuple[Key, Callable[[], Any]]], call: Call, *, packed: bool
    ) -> Iterator[tuple[Key, Rows]]:
        """Each batch's rows, in order, from ``(key, its input)`` jobs: the packed or streamed
        forward's runner, or Hugging Face's padded forward one batch at a time."""
        self._follow_model()
        if packed:
            assert self.runner is not None
            yield from self.runner.rows(jobs, call)
            return
        for key, batch in jobs:
            yield key, self._forward_padded(batch(), call)

    def _follow_model(self) -> None:
        """Replicas of the user's model as it is now (hooks added to it since, modules replaced): its
        state read once a run; the packed forwards wait only while the general replica is rebuilt."""
        if self.models.built:
            state = model_state(self.model)
            if isinstance(self.packed, PackedDecoder):
                self.packed.follow(state)
            self.general.follow(state, self.lock.exclusive)

    def _forward_padded(self, units: Sequence[EncodedInput | Window], call: Call) -> Rows:
        model = self.model  # built (and adopted) before the lock is taken
        batch = collate(units, pad_id=self.pad_id, with_token_types=self.with_token_types, device=self.device)
        kernels = attention_kernels(self.device)  # no cuDNN attention: it plans each new shape (sdpa.py)
        with self.lock.exclusive(), torch.inference_mode(), kernels:
            hidden, tapped = forward_batch(
                self.general.replica(call.taps),
                batch,
                layers=call.layers,
                method=call.method,
                reading=self.general.reading,
                model_type=self.model_type,
                taps=call.taps,
            )
            hidden = apply_final_norm(model, hidden, call.layers, call.final_norm)
        return split_rows(HostCopy(hidden, tapped, RESULT_DTYPES[call.dtype]), [len(u) for u in units])

    def runs_packed(self, method: Method, taps: tuple[str, ...]) -> bool:
        """Whether a call runs on the packed (or streamed) forward: it gives hidden states, and a
        decoder's attn_out and mlp_out; other taps and hooks need the Hugging Face modules' own
        forward, and so do hooks a user put on the model, which the encoders' packed kernels would
        not run. The batching (real or padded token budget) follows the same choice."""
        if self.runner is None or method != "hidden_states":
            return False
        if isinstance(self.packed, PackedEncoder) and self.models.built and users_hooks(self.model):
            return False
        return not taps or (isinstance(self.packed, PackedDecoder) and set(taps) <= set(PACKED_TAPS))


def _raise(exc: BaseException) -> Any:
    raise exc
