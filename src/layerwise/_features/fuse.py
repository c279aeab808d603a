"""Layer fusion: many hidden states in, one feature vector out.

Named strategies cover the rows of the BERT paper's Table 7 (feature-based NER on CoNLL-2003,
BERT-base, dev F1) and more; each picks its own layers:

    embeddings       hidden state 0                                   (Table 7: 91.0)
    last             the last layer                                   (94.9)
    second_to_last   the layer before it                              (95.6)
    sum_last4        sum of the last four hidden states               (95.9)
    mean_last4       their mean
    concat_last4     their concatenation, in layer order, 4 x hidden  (96.1)
    sum_all          sum of every hidden state, embeddings included   (95.5, "weighted sum of all 12")
    mean_all         their mean

Generic strategies work over whatever ``layers`` were asked for: ``mean``, ``sum``, ``concat``.
A trainable weighted sum is :class:`layerwise.ScalarMix`. :func:`layer_deltas` and
:func:`layer_drift` describe what each layer adds to the one before.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import LayerSpecError, OptionError
from .layers import resolve_layers
from .names import FUSIONS, GENERIC_FUSIONS, NAMED_FUSIONS


def check_fusion(name: str) -> None:
    if name not in FUSIONS:
        raise OptionError(f"fuse={name!r} is not valid; choose one of {', '.join(FUSIONS)}")


def fusion_layers(name: str, n_hidden_states: int) -> tuple[int, ...] | None:
    """Hidden states a named fusion needs (None for the generic ones, which take ``layers``)."""
    check_fusion(name)
    if name in GENERIC_FUSIONS:
        return None
    spec, _ = NAMED_FUSIONS[name]
    try:
        return resolve_layers(spec, n_hidden_states)
    except LayerSpecError as exc:
        raise OptionError(f"fuse={name!r} needs {spec!r} but {exc}") from None


def fuse_layers(
    array: np.ndarray, layers: Sequence[int], name: str, *, n_hidden_states: int, axis: int = 0
) -> np.ndarray:
    """Fuse the layer axis ``axis`` of ``array`` (holding hidden states ``layers``) with ``name``.

    The layer axis disappears; ``concat`` strategies grow the last axis instead."""
    check_fusion(name)
    layers = tuple(layers)
    if array.shape[axis] != len(layers):
        raise OptionError(f"array has {array.shape[axis]} layers on axis {axis} but layers={layers}")
    wanted = fusion_layers(name, n_hidden_states)
    operation = NAMED_FUSIONS[name][1] if name in NAMED_FUSIONS else name
    if wanted is None:
        picked = np.moveaxis(array, axis, 0)
    else:
        missing = [i for i in wanted if i not in layers]
        if missing:
            raise OptionError(f"fuse={name!r} needs hidden states {wanted} but {missing} were not extracted")
        # layer order for concatenation is the model's order, whatever order they were extracted in
        picked = np.stack([np.take(array, layers.index(i), axis=axis) for i in wanted])
    if operation == "select":
        return picked[0]
    if operation == "sum":
        return picked.sum(axis=0, dtype=np.float64).astype(array.dtype)
    if operation == "mean":
        return picked.mean(axis=0, dtype=np.float64).astype(array.dtype)
    return np.concatenate(list(picked), axis=-1)


def layer_deltas(hidden: np.ndarray, axis: int = 0) -> np.ndarray:
    """``h_l - h_{l-1}`` between consecutive entries of the layer axis: one fewer layer."""
    if hidden.shape[axis] < 2:
        raise OptionError("layer differences need at least two layers")
    return np.diff(hidden, axis=axis)


def layer_drift(hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-token drift between consecutive layers of ``hidden`` (n_layers, n_tokens, dim):
    ``||h_l - h_{l-1}||`` and ``cos(h_l, h_{l-1})``, each ``(n_layers - 1, n_tokens)``."""
    h = hidden.astype(np.float64)
    norms = np.linalg.norm(h, axis=-1)
    distance = np.linalg.norm(np.diff(h, axis=0), axis=-1)
    cosine = np.sum(h[1:] * h[:-1], axis=-1) / np.maximum(norms[1:] * norms[:-1], 1e-12)
    return distance, cosine
