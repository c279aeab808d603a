"""Words and layers in two dimensions: where words occur in extracted texts, and the projection
(PCA, t-SNE, UMAP) that ``layerwise plot``, the HTML report and the layer explorer draw.

scikit-learn (and umap-learn for UMAP) are imported when a projection runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np

from .._results import LayerStack
from ..errors import InputError, MissingDependencyError, check_choice

Projection = Literal["pca", "tsne", "umap"]
PROJECTIONS: tuple[str, ...] = ("pca", "tsne", "umap")


def project(points: np.ndarray, projection: Projection = "pca", *, seed: int = 0) -> np.ndarray:
    """``(n, dim)`` -> ``(n, 2)``."""
    check_choice("projection", projection, PROJECTIONS)
    if len(points) < 3:
        raise InputError(f"a projection needs at least 3 points, got {len(points)}")
    try:
        import sklearn  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(
            f"projection={projection!r} needs scikit-learn: pip install scikit-learn"
        ) from exc
    if projection == "pca":
        from sklearn.decomposition import PCA

        return PCA(n_components=2, random_state=seed).fit_transform(points)
    if projection == "tsne":
        from sklearn.manifold import TSNE

        perplexity = float(min(30, max(2, (len(points) - 1) // 3)))
        return TSNE(n_components=2, perplexity=perplexity, random_state=seed, init="pca").fit_transform(
            points
        )
    try:
        import umap
    except ImportError as exc:
        raise MissingDependencyError("projection='umap' needs umap-learn: pip install umap-learn") from exc
    return umap.UMAP(n_components=2, random_state=seed, n_neighbors=min(15, len(points) - 1)).fit_transform(
        points
    )


def word_sites(
    stacks: Iterable[LayerStack], words: Sequence[str]
) -> tuple[np.ndarray, list[str], tuple[int, ...], list[tuple[int, int, int, int]]]:
    """Every occurrence of ``words`` (case-insensitive, mean of its wordpieces) as
    ``layerwise plot`` finds them: ``(vectors (n_layers, n, dim), labels, layers, sites)``, where
    ``sites[i]`` is ``(stack index, segment, start, end)``: where point i's word is, as a
    character span of the stack's text (segment 0) or text pair (segment 1)."""
    from .._features.pool import pool_words

    wanted = {w.strip().lower() for w in words if w.strip()}
    if not wanted:
        raise InputError("pass at least one word, e.g. words=['bank', 'crane']")
    points: list[np.ndarray] = []
    labels: list[str] = []
    sites: list[tuple[int, int, int, int]] = []
    held: tuple[int, ...] = ()
    for s, stack in enumerate(stacks):
        vectors = pool_words(stack, "mean")
        held = vectors.layers
        for j, word in enumerate(vectors.words):
            if word.lower() in wanted:
                points.append(vectors.vectors[:, j])
                labels.append(word.lower())
                start, end = (int(x) for x in vectors.spans[j])
                sites.append((s, int(vectors.segment_ids[j]), start, end))
    if len(points) < 3:
        raise InputError(
            f"found {len(points)} occurrences of {', '.join(sorted(wanted))} in the texts; "
            "a projection needs 3 or more: try other words"
        )
    return np.stack(points, axis=1), labels, held, sites


def word_occurrences(
    stacks: Iterable[LayerStack], words: Sequence[str]
) -> tuple[np.ndarray, list[str], tuple]:
    """Every occurrence of ``words`` (case-insensitive; mean of its wordpieces) in ``stacks``:
    ``(vectors (n_layers, n_points, dim), labels, layers)`` (see word_sites)."""
    points, labels, held, _ = word_sites(stacks, words)
    return points, labels, held
