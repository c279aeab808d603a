"""A batch's outputs on the host, cut per input: :class:`Rows` of a padded batch (``split_rows``) or
a packed one (``packed_rows``), an input's :class:`~layerwise.LayerStack` made of its rows
(``make_stack``) or stitched from its windows (``stitch_stack``), and the error naming an input whose
states hold NaN or inf."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from .._inputs.block import EncodedBlock, EncodedInput, segment_ids
from .._inputs.windows import stitch
from .._results import FLOAT16_MAX, LayerStack, float16_overflow
from ..errors import NonFiniteError
from .host_copy import HostCopy

logger = logging.getLogger("layerwise")


class Rows:
    """One batch's outputs on the host, per unit ``(hidden (L, n, H), taps)``: views of one array
    ``(L, R, W)`` with the units' rows back to back (``array``, ``sizes``: a packed batch, or its
    pooled rows), or one array per unit (``parts``: a padded batch, cut). ``nonfinite``: the batch
    held NaN or inf (then the units are looked at one by one); ``peak``: the largest magnitude of
    float16 rows before their cast. ``owner``: for rows pooled on the device, each token's row
    (-1: none), as the pools grouped them."""

    def __init__(
        self,
        sizes: Sequence[int],
        array: np.ndarray | None = None,
        taps: Mapping[str, np.ndarray] | None = None,
        parts: list[tuple[np.ndarray, dict[str, np.ndarray]]] | None = None,
        nonfinite: bool = False,
        owner: np.ndarray | None = None,
        peak: float = 0.0,
    ) -> None:
        self.sizes = list(sizes)
        # float16 rows whose values passed 65,504 before the cast: inf now, refused (check_overflow)
        self.overflows = FLOAT16_MAX < peak < np.inf
        self.peak = peak
        self.array, self.taps, self.parts, self.nonfinite = array, dict(taps or {}), parts, nonfinite
        self.owner = owner
        self.starts = np.concatenate([[0], np.cumsum(self.sizes, dtype=np.int64)]).tolist()

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, k: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        if self.parts is not None:
            return self.parts[k]
        assert self.array is not None
        lo, hi = self.starts[k], self.starts[k + 1]
        return self.array[:, lo:hi], {name: t[:, lo:hi] for name, t in self.taps.items()} if self.taps else {}

    def __iter__(self) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        return (self[k] for k in range(len(self)))


def split_rows(copy: HostCopy, lengths: Sequence[int]) -> Rows:
    """Cut a padded batch into per-row arrays without padding: ``(hidden (L, n, H), taps)``."""
    hidden_np, taps_np, finite = copy.arrays()
    parts = []
    for row, n in enumerate(lengths):
        taps = {}
        for name, array in taps_np.items():
            if name == "attention_probs":
                taps[name] = np.ascontiguousarray(array[:, row, :, :n, :n])
            else:
                taps[name] = np.ascontiguousarray(array[:, row, :n])
        parts.append((np.ascontiguousarray(hidden_np[:, row, :n]), taps))
    # padding is summed too: a NaN there marks the batch, and then the rows are looked at one by one
    return Rows(lengths, parts=parts, nonfinite=not finite, peak=copy.peak())


def make_stack(
    item: EncodedInput,
    hidden: np.ndarray,
    taps: Mapping[str, np.ndarray],
    layers: Sequence[int],
    *,
    n_windows: int = 1,
    pooled: np.ndarray | None = None,
) -> LayerStack:
    n = len(item)
    return LayerStack(
        hidden=hidden if pooled is None else np.empty((len(layers), n, 0), dtype=np.float32),
        pooled=pooled,
        layers=tuple(layers),
        tokens=item.tokens,
        offsets=np.asarray(item.offsets, dtype=np.int32).reshape(n, 2),
        word_ids=word_id_array(item),
        segment_ids=segment_ids(item.sequence_ids),
        text=item.text,
        text_pair=item.text_pair,
        words=item.words,
        truncated=item.truncated,
        words_lost=item.words_lost,
        words_empty=item.words_empty,
        n_windows=n_windows,
        taps=dict(taps),
        tap_layers=tuple(i for i in layers if i >= 1) if taps else (),
    )


def word_id_array(item: EncodedInput) -> np.ndarray:  # -1 for special tokens, as LayerStack.word_ids
    return np.asarray([-1 if w is None else w for w in item.word_ids], dtype=np.int32)


def packed_rows(lengths: list[int], copy: HostCopy, owner: np.ndarray | None = None) -> Rows:
    """A packed batch's rows: views of the batch's arrays, not copies (the rows are contiguous per
    layer, and every consumer (the store's transposing cast, pooling, npz) reads them once anyway).
    ``lengths``: each input's rows: its tokens, or its pooled vectors (one, or one per word);
    ``owner``: pooled rows' token -> row map (device_pool.pool_batch)."""
    array, taps, finite = copy.arrays()
    return Rows(lengths, array, taps, nonfinite=not finite, owner=owner, peak=copy.peak())


def stitch_stack(item: EncodedInput, parts: dict[int, tuple], layers: tuple[int, ...]) -> LayerStack:
    ordered = [parts[k] for k in range(len(parts))]
    windows = [w for w, _, _ in ordered]
    hidden = stitch([h for _, h, _ in ordered], windows, len(item), token_axis=1)
    taps = {
        name: stitch([t[name] for _, _, t in ordered], windows, len(item), token_axis=1)
        for name in ordered[0][2]
    }
    return make_stack(item, hidden, taps, layers, n_windows=len(windows))


def check_overflow(out: Rows, inputs: Sequence[int] | np.ndarray, layers: tuple[int, ...]) -> None:
    """Refuse float16 rows that a value past 65,504 made inf in their cast (``out.overflows``), naming
    the first input (``inputs``: each unit's) and hidden state that hold one. Inf in a batch whose
    float32 sum was finite comes from the cast only: the model's own NaN/inf is nonfinite_error's."""
    if not out.overflows or out.nonfinite:
        return
    for k, (hidden, taps) in enumerate(out):
        for values in (hidden, *taps.values()):
            bad = np.isinf(values.reshape(values.shape[0], -1)).any(axis=1)
            if bad.any():
                layer = layers[int(np.argmax(bad))] if len(layers) == len(bad) else None
                what = (
                    f"input {int(inputs[k])}"
                    if layer is None
                    else f"hidden state {layer} of input {int(inputs[k])}"
                )
                raise float16_overflow(f"{what} holds a value (its batch reaches {out.peak:,.0f})")


def warn_nonfinite(indices: list[int]) -> None:
    """Inputs kept with NaN or inf on request (allow_nan): a silent NaN is a wrong number, so say so."""
    logger.warning(
        "%d input(s) have NaN or inf in their hidden states (first: input %d); the model produced "
        "them: with model_dtype='float16' try float32, else check the weights",
        len(set(indices)),
        min(indices),
    )


def nonfinite_error(index: int, text: str, hidden: np.ndarray, layers: tuple[int, ...]) -> NonFiniteError:
    """The error for input ``index`` (``text``) whose hidden states (``(L, n, H)`` of ``layers``)
    hold NaN or inf."""
    finite = np.isfinite(hidden.reshape(hidden.shape[0], -1)).all(axis=1)
    first = int(np.flatnonzero(~finite)[0]) if (~finite).any() else 0
    return NonFiniteError(
        f"the model produced NaN or inf for input {index} ({text!r:.60}) at hidden state "
        f"{layers[first]}: with model_dtype='float16' try float32, else check the weights; "
        "allow_nan=True (--allow-nan) keeps them",
        index=index,
        layer=layers[first],
    )


def block_stacks(
    block: EncodedBlock, rows: np.ndarray, out: Rows, layers: tuple[int, ...], pooled: str | None
) -> Iterator[tuple[int, LayerStack]]:
    """The LayerStack of each input ``rows`` (of ``block``) of one batch, in batch order: its states
    (or its pooled rows: ``pooled`` "sentence" or "word") and token columns are views of the batch's
    and the block's arrays, not copies."""
    for k, i in enumerate(rows.tolist()):
        hidden, taps = out[k]
        yield block.first + i, block_stack(block, i, hidden, taps, layers, pooled)


def block_stack(
    block: EncodedBlock,
    i: int,
    hidden: np.ndarray,
    taps: Mapping[str, np.ndarray],
    layers: tuple[int, ...],
    pooled: str | None,
) -> LayerStack:
    """Input ``i`` of ``block`` as a LayerStack of its rows ``hidden`` (see :func:`block_stacks`)."""
    lo, hi = block.bounds[i], block.bounds[i + 1]
    return LayerStack(
        hidden=hidden if pooled is None else np.empty((len(layers), hi - lo, 0), dtype=np.float32),
        pooled=None if pooled is None else hidden[:, 0] if pooled == "sentence" else hidden,
        layers=layers,
        tokens=block.tokens(i),
        offsets=block.offsets[lo:hi],
        word_ids=block.word_ids[lo:hi],
        segment_ids=block.segments[lo:hi],
        text=block.texts[i],
        text_pair=block.text_pairs[i] if block.text_pairs is not None else None,
        words=block.words[i] if block.words is not None else None,
        truncated=bool(block.truncated[i]),
        words_lost=int(block.words_lost[i]),
        words_empty=block.words_empty.get(i, ()),
        taps=dict(taps) if taps else {},
        tap_layers=tuple(j for j in layers if j >= 1) if taps else (),
    )
