"""Layer analysis: how representations change from layer to layer.

    layer_similarity   linear CKA (Kornblith et al. 2019) or mean cosine between every pair of layers
    drift              per layer: mean ||h_l - h_{l-1}|| and mean cos(h_l, h_{l-1}) over tokens
    anisotropy         per layer: expected cosine of two random tokens (Ethayarajh 2019's baseline)
    self_similarity    per layer: mean cosine between a word's vectors in different contexts
    intra_sentence_similarity
                       per layer: mean cosine between each word and its sentence's mean vector

The label-free metrics (which layer to try without labels, Skean et al. 2025) are in
label_free.py; ``lw.analyze`` (layerwise/analyze.py) holds both.

Self- and intra-sentence similarity are reported minus the anisotropy of the same layer, as
Ethayarajh (2019) does, so that 0 means "no more similar than two random words". Every function
accepts LayerStacks (token level), WordVectors (word level) or an open store; the arrays of a
sentence-level store or ``Encoder.embed`` output ``(n_texts, n_layers, hidden)`` work for the
layer-to-layer statistics too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from .._features.pool import pool_words
from .._results import LayerStack, WordVectors
from ..errors import InputError, OptionError, check_choice

Measure = Literal["cka", "cosine"]


# ---------------------------------------------------------------------------------------------- inputs
def layer_matrix(
    source, *, max_rows: int | None = 20000, seed: int = 0
) -> tuple[np.ndarray, tuple[int, ...]]:
    """Rows of every layer: ``(n_layers, n_rows, dim)`` float64 and the layer indices.

    ``source``: LayerStacks (rows = tokens), WordVectors (rows = words), a Store, or an array
    ``(n_rows, n_layers, dim)``. At most ``max_rows`` rows are kept (a fixed random sample)."""
    from ..store._reader import Store  # not ..store, whose writer imports the model

    if isinstance(source, np.ndarray):
        if source.ndim != 3:
            raise InputError(f"an array source must be (n_rows, n_layers, dim), got shape {source.shape}")
        matrix, layers = source.transpose(1, 0, 2), tuple(range(source.shape[1]))
    elif isinstance(source, Store):
        if source.data.ndim != 3:
            raise InputError("this store holds fused vectors: there are no layers to compare")
        n = source.n_rows
        rows = _sample(n, max_rows, seed)
        data = source.data
        matrix = np.asarray(
            data[:n] if rows is None else data.get_orthogonal_selection((rows, slice(None), slice(None)))
        )
        return matrix.transpose(1, 0, 2).astype(np.float64), source.layers
    else:
        items = list(source)
        if not items:
            raise InputError("nothing to analyse: the source is empty")
        if isinstance(items[0], LayerStack):
            matrix = np.concatenate([s.hidden for s in items], axis=1)
        elif isinstance(items[0], WordVectors):
            if items[0].vectors.ndim != 3:
                raise InputError("these word vectors are fused: there are no layers to compare")
            matrix = np.concatenate([w.vectors for w in items], axis=1)
        else:
            raise InputError(
                f"cannot analyse items of type {type(items[0]).__name__}; pass LayerStacks or WordVectors"
            )
        layers = items[0].layers
    rows = _sample(matrix.shape[1], max_rows, seed)
    if rows is not None:
        matrix = matrix[:, rows]
    return matrix.astype(np.float64), tuple(layers)


def _sample(n: int, max_rows: int | None, seed: int) -> np.ndarray | None:
    if max_rows is None or n <= max_rows:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, max_rows, replace=False))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


# ---------------------------------------------------------------------------------------------- statistics
def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA between two representations of the same n rows (Kornblith et al. 2019, eq. 4):
    ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F) on column-centred X and Y."""
    x = x - x.mean(axis=0)
    y = y - y.mean(axis=0)
    cross = np.linalg.norm(y.T @ x) ** 2
    norm = np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)
    return float(cross / norm) if norm > 0 else 0.0


def layer_similarity(
    source, measure: Measure = "cka", *, max_rows: int | None = 20000, seed: int = 0
) -> np.ndarray:
    """``(n_layers, n_layers)``: linear CKA, or the mean cosine between a row's vectors in two layers."""
    check_choice("measure", measure, ("cka", "cosine"))
    matrix, _ = layer_matrix(source, max_rows=max_rows, seed=seed)
    n = matrix.shape[0]
    out = np.eye(n)
    if measure == "cosine":
        unit = _unit(matrix)
        for i in range(n):
            for j in range(i + 1, n):
                out[i, j] = out[j, i] = float(np.mean(np.sum(unit[i] * unit[j], axis=-1)))
        return out
    # linear_cka's formula with each layer's centring and ||X^T X||_F computed once, not per pair
    centred = matrix - matrix.mean(axis=1, keepdims=True)
    self_norms = [np.linalg.norm(x.T @ x) for x in centred]
    for i in range(n):
        for j in range(i + 1, n):
            norm = self_norms[i] * self_norms[j]
            cross = np.linalg.norm(centred[j].T @ centred[i]) ** 2
            out[i, j] = out[j, i] = float(cross / norm) if norm > 0 else 0.0
    return out


def drift(source, *, max_rows: int | None = 20000, seed: int = 0) -> dict[str, np.ndarray]:
    """Per consecutive pair of held layers: ``distance`` = mean ||h_l - h_{l-1}||, ``cosine`` = mean
    cos(h_l, h_{l-1}); ``layers`` = the later layer of each pair."""
    matrix, layers = layer_matrix(source, max_rows=max_rows, seed=seed)
    if matrix.shape[0] < 2:
        raise OptionError("drift needs at least two layers")
    distance = np.linalg.norm(np.diff(matrix, axis=0), axis=-1).mean(axis=1)
    unit = _unit(matrix)
    cosine = np.sum(unit[1:] * unit[:-1], axis=-1).mean(axis=1)
    return {"layers": np.asarray(layers[1:]), "distance": distance, "cosine": cosine}


def anisotropy(source, *, n_pairs: int = 20000, max_rows: int | None = 20000, seed: int = 0) -> np.ndarray:
    """Per layer: the mean cosine of ``n_pairs`` random pairs of distinct rows (tokens or words).
    Near 0 for isotropic vectors; Ethayarajh (2019) found it grows with depth in BERT."""
    matrix, _ = layer_matrix(source, max_rows=max_rows, seed=seed)
    n = matrix.shape[1]
    if n < 2:
        raise InputError("anisotropy needs at least two rows")
    rng = np.random.default_rng(seed)
    a = rng.integers(0, n, n_pairs)
    b = (a + rng.integers(1, n, n_pairs)) % n  # never the same row
    unit = _unit(matrix)
    return np.sum(unit[:, a] * unit[:, b], axis=-1).mean(axis=1)


def _word_items(source) -> list[WordVectors]:
    items = list(source)
    if items and isinstance(items[0], LayerStack):
        return [pool_words(s, "mean") for s in items]
    if items and isinstance(items[0], WordVectors):
        return items
    raise InputError("self- and intra-sentence similarity need LayerStacks or WordVectors")


def self_similarity(
    source, words: Sequence[str], *, adjust: bool = True, seed: int = 0
) -> dict[str, np.ndarray]:
    """Per word and layer: the mean cosine between the word's vectors in different contexts
    (Ethayarajh 2019), minus the layer's anisotropy when ``adjust``. Words match case-insensitively;
    a word seen fewer than twice is reported as NaN."""
    items = _word_items(source)
    baseline = anisotropy(items, seed=seed) if adjust else 0.0
    out = {}
    for word in words:
        target = word.lower()
        occurrences = [
            item.vectors[:, j] for item in items for j, w in enumerate(item.words) if w.lower() == target
        ]
        n_layers = items[0].vectors.shape[0]
        if len(occurrences) < 2:
            out[word] = np.full(n_layers, np.nan)
            continue
        unit = _unit(np.stack(occurrences, axis=1).astype(np.float64))  # (L, k, dim)
        gram = np.einsum("lkd,lmd->lkm", unit, unit)
        k = unit.shape[1]
        mean = (gram.sum(axis=(1, 2)) - np.trace(gram, axis1=1, axis2=2)) / (k * (k - 1))
        out[word] = mean - baseline
    return out


def intra_sentence_similarity(source, *, adjust: bool = True, seed: int = 0) -> np.ndarray:
    """Per layer: the mean, over sentences, of the mean cosine between each word and the sentence's
    mean vector (Ethayarajh 2019), minus the layer's anisotropy when ``adjust``."""
    items = [w for w in _word_items(source) if w.n_words >= 2]
    if not items:
        raise InputError("intra-sentence similarity needs sentences of at least two words")
    per_sentence = []
    for item in items:
        v = item.vectors.astype(np.float64)  # (L, n_words, dim)
        centre = _unit(v.mean(axis=1, keepdims=True))
        per_sentence.append(np.sum(_unit(v) * centre, axis=-1).mean(axis=1))
    value = np.mean(per_sentence, axis=0)
    return value - (anisotropy(items, seed=seed) if adjust else 0.0)
