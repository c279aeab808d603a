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

import inspect
import logging
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from ._features.device_pool import DevicePlan, finish, pool_batch
from ._inputs.batches import length_sorted_batches
from ._inputs.encoding import EncodedInput, segment_ids
from ._inputs.windows import Window, plan_windows
from ._model.decoders import apply_final_norm, is_decoder_config
from ._model.handle import ModelHandle
from ._model.hooks import eager_attention_for, find_layer_list
from ._model.host_copy import RESULT_DTYPES, HostCopy
from ._model.packed_decoder import PACKED_TAPS, PackedDecoder, packed_forward
from ._model.padded import collate, forward_batch
from ._model.sdpa import attention_kernels
from ._model.streams import ForwardLock, ForwardPool, check_streams
from ._progress import progress_bar
from ._results import LayerStack
from ._rows import Rows, make_stack, nonfinite_error, packed_rows, split_rows, stitch_stack, word_id_array
from ._settings import FinalNorm, Method, Settings
from .errors import ModelLoadError, OptionError

logger = logging.getLogger("layerwise")


def warm_up(model: Any, ids: list[int], device: torch.device, name: str) -> None:
    """One full-depth forward with ``output_hidden_states`` before any truncated one.

    transformers 5 installs its hidden-state capture hooks lazily, on the layers present at the
    first such call; if that call ran on a truncated encoder, later full runs would miss layers.
    This also checks that the model returns one hidden state per layer plus the embeddings."""
    expected = model.config.num_hidden_layers + 1
    with torch.inference_mode():
        states = model(input_ids=torch.tensor([ids], device=device), output_hidden_states=True).hidden_states
    if len(states) != expected:
        raise ModelLoadError(
            f"{name!r} returned {len(states)} hidden states, expected {expected} "
            "(embeddings + one per layer); is it a BERT-family encoder?"
        )


class Engine:
    """The extraction loop: inputs (or their windows) in length-sorted batches under a token
    budget, the forward pass cut at the deepest requested layer, windows stitched back, results
    streamed as ``(input index, LayerStack)`` as batches finish (longest first)."""

    # settings: packed, streams, allow_nan; max_length, batch_size, max_tokens resolved for the device
    def __init__(self, models: ModelHandle, tokenizer: Any, settings: Settings, *, device: torch.device,
                 max_length: int, batch_size: int, max_tokens: int) -> None:  # fmt: skip
        config = models.config
        self.allow_nan = settings.allow_nan
        packed, streams = settings.packed, settings.streams
        pad_id = tokenizer.pad_token_id
        self.models, self.device, self.max_length = models, device, max_length
        self.pad_id: int = pad_id if pad_id is not None else (getattr(config, "pad_token_id", None) or 0)
        # a light model stands only for types whose transformers forward takes token_type_ids
        forward = models.current.forward if models.built else None
        accepts_types = forward is None or "token_type_ids" in inspect.signature(forward).parameters
        self.with_token_types = accepts_types and getattr(config, "type_vocab_size", 0) >= 2
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.model_type: str = config.model_type
        self.causal = is_decoder_config(config)  # windows keep each token's left context (windows.py)
        self._warm_up_ids = [tokenizer.cls_token_id or 0, tokenizer.sep_token_id or 0]
        # packed forwards share the model; a Hugging Face one (hooks, truncation patch it) runs alone
        self.lock = ForwardLock()
        # the unpadded forward where the architecture allows it (packed.py, packed_decoder.py); None:
        # Hugging Face's padded one
        self.packed = packed_forward(models.current) if packed else None
        streams = check_streams(streams, device, config.hidden_size)
        self.pool = ForwardPool(streams) if streams > 1 and self.packed is not None else None
        if models.built:
            self._adopt(models.current)
        else:
            models.on_transformers(self._adopt)

    @property
    def model(self) -> Any:
        """The transformers model (built on first use: see model_handle.py)."""
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
        self,
        encoded: list[EncodedInput],
        *,
        layers: tuple[int, ...],
        method: Method,
        taps: tuple[str, ...],
        stride: int | None,
        batch_size: int | None,
        max_tokens: int | None,
        progress: bool | None,
        final_norm: FinalNorm = True,
        device_pool: DevicePlan | None = None,
        dtype: str = "float32",
    ) -> Iterator[tuple[int, LayerStack]]:
        """Plan units and batches now (so bad input fails here), run them lazily. ``final_norm``:
        a decoder's final norm on the last hidden state (True), none (False) or every one ("all");
        ``device_pool`` and ``dtype``: see ``_Call``."""
        for name, value in (("batch_size", batch_size), ("max_tokens", max_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise OptionError(f"{name}={value!r} must be a whole number >= 1 (or None)")
        units: list[EncodedInput | Window] = []
        owners: list[tuple[int, int]] = []  # per unit: (input index, window number or -1)
        n_windows: dict[int, int] = {}
        for item in encoded:
            if len(item) <= self.max_length:
                units.append(item)
                owners.append((item.index, -1))
                continue
            if "attention_probs" in taps:
                raise OptionError(
                    f"attention_probs cannot be stitched across windows (input {item.index} has "
                    f"{len(item)} tokens > {self.max_length}); use long_texts='truncate' for attention maps"
                )
            windows = plan_windows(item, self.max_length, stride, causal=self.causal)
            n_windows[item.index] = len(windows)
            for k, window in enumerate(windows):
                units.append(window)
                owners.append((item.index, k))
        packed = self._runs_packed(method, taps)
        lengths = [len(u) for u in units]
        budget = max_tokens or self.max_tokens
        if packed and self.pool is not None and lengths:
            # fewer batches than streams would leave a stream idle (a server's run of a few short
            # requests fits one batch): split the tokens evenly, in at most that many batches
            budget = min(budget, -(-sum(lengths) // self.pool.streams) + max(lengths))
        batches = length_sorted_batches(lengths, batch_size or self.batch_size, budget, padded=not packed)
        on_device = device_pool if packed and not n_windows and not taps else None
        run = _Call(layers, method, taps, final_norm, on_device, RESULT_DTYPES[dtype])
        return self._run(encoded, units, owners, n_windows, batches, run, progress)

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
        run = _Call(layers, "hidden_states" if packed else "hooks", taps, final_norm)
        lengths = [len(u) for u in units]
        batches = length_sorted_batches(lengths, self.batch_size, self.max_tokens, padded=not packed)
        return self._batch_rows(list(units), batches, run)

    def _run(
        self,
        encoded: list[EncodedInput],
        units: list[EncodedInput | Window],
        owners: list[tuple[int, int]],
        n_windows: dict[int, int],
        batches: list[list[int]],
        run: _Call,
        progress: bool | None,
    ) -> Iterator[tuple[int, LayerStack]]:
        layers = run.layers
        quiet = progress is None and len(batches) <= 1
        bar = None if quiet else progress_bar("extracting", "inputs", progress)
        task = bar.add_task("extract", total=len(units)) if bar is not None else None
        pending: dict[int, dict[int, tuple]] = {}  # windows of long inputs until all are done
        nonfinite: set[int] = set()  # inputs whose vectors hold NaN or inf
        with bar if bar is not None else nullcontext():
            for batch_ids, rows in self._batch_rows(units, batches, run):
                for u, (hidden, tapped) in zip(batch_ids, rows, strict=True):
                    index, k = owners[u]
                    if rows.nonfinite and not np.isfinite(hidden).all():
                        if not self.allow_nan:
                            raise nonfinite_error(encoded[index], hidden, layers)
                        nonfinite.add(index)
                    if k < 0:  # pooled on the device: the rows are the input's pooled vectors
                        pooled = None if run.device_pool is None else hidden[:, 0] if run.sentence else hidden
                        yield index, make_stack(encoded[index], hidden, tapped, layers, pooled=pooled)
                        continue
                    pending.setdefault(index, {})[k] = (units[u], hidden, tapped)
                    if len(pending[index]) == n_windows[index]:
                        yield index, stitch_stack(encoded[index], pending.pop(index), layers)
                if bar is not None and task is not None:
                    bar.advance(task, len(batch_ids))
        if nonfinite:
            # kept on request (allow_nan), but a silent NaN is a wrong number: say so
            logger.warning(
                "%d input(s) have NaN or inf in their hidden states (first: input %d); the model produced "
                "them: with model_dtype='float16' try float32, else check the weights",
                len(nonfinite),
                min(nonfinite),
            )

    def _batch_rows(
        self,
        units: list[EncodedInput | Window],
        batches: list[list[int]],
        run: _Call,
    ) -> Iterator[tuple[list[int], Rows]]:
        """Each batch with its rows, in order; on the forward pool's streams when it has one (a few
        batches ahead of the caller, who consumes the rows meanwhile); on a GPU one batch ahead."""
        packed = self._runs_packed(run.method, run.taps)
        if packed and self.device.type == "cuda":
            # launch batch k+1 before reading batch k: the GPU computes while the host copies (host_copy.py)
            waiting: tuple[list[int], list[int], HostCopy] | None = None
            for batch_ids in batches:
                launched = (batch_ids, *self._launch_packed([units[u] for u in batch_ids], run))
                if waiting is not None:
                    yield waiting[0], packed_rows(*waiting[1:])
                waiting = launched
            if waiting is not None:
                yield waiting[0], packed_rows(*waiting[1:])
            return
        if self.pool is None or not packed:
            for batch_ids in batches:
                yield batch_ids, self._forward_units([units[u] for u in batch_ids], run)
            return
        ahead: deque[tuple[list[int], Future]] = deque()
        try:
            for batch_ids in batches:
                ahead.append(
                    (batch_ids, self.pool.submit(self._forward_packed, [units[u] for u in batch_ids], run))
                )
                if len(ahead) > self.pool.streams:
                    batch_ids, future = ahead.popleft()
                    yield batch_ids, future.result()
            while ahead:
                batch_ids, future = ahead.popleft()
                yield batch_ids, future.result()
        finally:  # the caller stopped early or a batch failed: drop the batches not started
            for _, future in ahead:
                future.cancel()

    def _forward_units(self, units: Sequence[EncodedInput | Window], run: _Call) -> Rows:
        layers, method, taps = run.layers, run.method, run.taps
        if self._runs_packed(method, taps):
            return self._forward_packed(units, run)
        model = self.model  # built (and adopted) before the lock is taken
        batch = collate(units, pad_id=self.pad_id, with_token_types=self.with_token_types, device=self.device)
        kernels = attention_kernels(self.device)  # no cuDNN attention: it plans each new shape (sdpa.py)
        with self.lock.exclusive(), torch.inference_mode(), eager_attention_for(model, taps), kernels:
            hidden, tapped = forward_batch(
                model, batch, layers=layers, method=method, layer_owner=self.layer_owner,
                layer_attr=self.layer_attr, layer_list=self.layer_list, model_type=self.model_type, taps=taps,
            )  # fmt: skip
            hidden = apply_final_norm(model, hidden, layers, run.final_norm)
        return split_rows(HostCopy(hidden, tapped, run.dtype), [len(u) for u in units])

    def _runs_packed(self, method: Method, taps: tuple[str, ...]) -> bool:
        """The packed forward gives hidden states, and a decoder's attn_out and mlp_out: other taps
        and hooks need the Hugging Face modules' own forward. The batching (real or padded token
        budget) follows the same choice."""
        if self.packed is None or method != "hidden_states":
            return False
        return not taps or (isinstance(self.packed, PackedDecoder) and set(taps) <= set(PACKED_TAPS))

    def _forward_packed(self, units: Sequence[EncodedInput | Window], run: _Call) -> Rows:
        return packed_rows(*self._launch_packed(units, run))

    def _launch_packed(
        self, units: Sequence[EncodedInput | Window], run: _Call
    ) -> tuple[list[int], HostCopy]:
        """The batch's packed forward, launched, and its results on their way to the host."""
        packed: Any = self.packed  # one packed forward for the whole batch (_adopt may replace it)
        assert packed is not None
        batch = packed.prepare(units, with_token_types=self.with_token_types, device=self.device)
        with self.lock.shared(), torch.inference_mode(), attention_kernels(self.device):
            tapped: dict[str, torch.Tensor] = {}
            if run.taps:  # (L, N, H), and {tap: (L', N, H)}: real tokens only
                hidden, tapped = packed.forward_with_taps(batch, run.layers, run.taps)
            else:
                hidden = packed.forward(batch, run.layers)
            hidden = apply_final_norm(self.models.current, hidden, run.layers, run.final_norm)
            hidden, sizes = _device_pool(hidden, units, run, list(batch.lengths))
            return sizes, HostCopy(hidden, tapped, run.dtype)


def _device_pool(
    hidden: torch.Tensor, units: Sequence[EncodedInput | Window], run: _Call, lengths: list[int]
) -> tuple[torch.Tensor, list[int]]:
    """The batch's states, pooled where they are when the call pools on the device (only the pooled
    rows then cross to the host), and each input's number of rows."""
    plan = run.device_pool
    if plan is None:
        return hidden, lengths
    items = cast(Sequence[EncodedInput], units)  # no windows on this path; ids as each stack has them
    tokens = [(segment_ids(item.sequence_ids), word_id_array(item)) for item in items]
    pooled, sizes = pool_batch(hidden, tokens, plan.level, plan.pool, plan.special_tokens)
    return finish(pooled, run.layers, plan), sizes


@dataclass(frozen=True)
class _Call:
    """What one call of :meth:`Engine.stream` computes for each batch."""

    layers: tuple[int, ...]
    method: Method
    taps: tuple[str, ...]
    final_norm: FinalNorm
    # with the packed forward and no windows, each input's result is made on the device
    # (features/device_pool.py), and its stack carries it (``pooled``) and no token states
    device_pool: DevicePlan | None = None
    dtype: torch.dtype = torch.float32  # of the results: cast before they cross to the host

    @property
    def sentence(self) -> bool:
        return self.device_pool is not None and self.device_pool.level == "sentence"
