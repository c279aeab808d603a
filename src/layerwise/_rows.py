"""A batch's outputs on the host, cut per input: :class:`Rows` of a padded batch (``split_rows``) or
a packed one (``packed_rows``), an input's :class:`~layerwise.LayerStack` made of its rows
(``make_stack``) or stitched from its windows (``stitch_stack``), and the error naming an input whose
states hold NaN or inf."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ._inputs.encoding import EncodedInput, segment_ids
from ._inputs.windows import stitch
from ._model.host_copy import HostCopy
from ._results import LayerStack
from .errors import NonFiniteError


class Rows(list[tuple[np.ndarray, dict[str, np.ndarray]]]):
    """Per-row ``(hidden (L, n, H), taps)`` of one batch; ``nonfinite``: the batch held NaN/inf."""

    nonfinite: bool = False


def split_rows(copy: HostCopy, lengths: Sequence[int]) -> Rows:
    """Cut a padded batch into per-row arrays without padding: ``(hidden (L, n, H), taps)``."""
    hidden_np, taps_np, finite = copy.arrays()
    rows = Rows()
    rows.nonfinite = not finite  # padding is summed too: then the rows are looked at one by one
    for row, n in enumerate(lengths):
        taps = {}
        for name, array in taps_np.items():
            if name == "attention_probs":
                taps[name] = np.ascontiguousarray(array[:, row, :, :n, :n])
            else:
                taps[name] = np.ascontiguousarray(array[:, row, :n])
        rows.append((np.ascontiguousarray(hidden_np[:, row, :n]), taps))
    return rows


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


def packed_rows(lengths: list[int], copy: HostCopy) -> Rows:
    """A packed batch's rows: views of the batch's arrays, not copies (the rows are contiguous per
    layer, and every consumer (the store's transposing cast, pooling, npz) reads them once anyway).
    ``lengths``: each input's rows: its tokens, or its pooled vectors (one, or one per word)."""
    array, taps, finite = copy.arrays()
    rows = Rows()
    start = 0
    for n in lengths:
        rows.append((array[:, start : start + n], {k: t[:, start : start + n] for k, t in taps.items()}))
        start += n
    rows.nonfinite = not finite
    return rows


def stitch_stack(item: EncodedInput, parts: dict[int, tuple], layers: tuple[int, ...]) -> LayerStack:
    ordered = [parts[k] for k in range(len(parts))]
    windows = [w for w, _, _ in ordered]
    hidden = stitch([h for _, h, _ in ordered], windows, len(item), token_axis=1)
    taps = {
        name: stitch([t[name] for _, _, t in ordered], windows, len(item), token_axis=1)
        for name in ordered[0][2]
    }
    return make_stack(item, hidden, taps, layers, n_windows=len(windows))


def nonfinite_error(item: EncodedInput, hidden: np.ndarray, layers: tuple[int, ...]) -> NonFiniteError:
    """The error for an input whose hidden states (``(L, n, H)`` of ``layers``) hold NaN or inf."""
    finite = np.isfinite(hidden.reshape(hidden.shape[0], -1)).all(axis=1)
    first = int(np.flatnonzero(~finite)[0]) if (~finite).any() else 0
    return NonFiniteError(
        f"the model produced NaN or inf for input {item.index} ({item.text!r:.60}) at hidden state "
        f"{layers[first]}: with model_dtype='float16' try float32, else check the weights; "
        "allow_nan=True (--allow-nan) keeps them",
        index=item.index,
        layer=layers[first],
    )
