"""Figures: per-layer 2-D projections, layer-similarity heatmaps, per-layer statistics.

matplotlib is imported lazily (``pip install 'layerwise[plot]'``); every function writes a file and
returns its path. Projections: PCA (default, scikit-learn), t-SNE (scikit-learn) or UMAP (the
optional umap-learn package).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from .._results import LayerStack
from ..errors import MissingDependencyError, check_choice
from .projection import PROJECTIONS, Projection, project, word_occurrences


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError("plots need matplotlib: pip install 'layerwise[plot]'") from exc
    return plt


def _plain(text: str) -> str:
    return text.replace("$", r"\$")


def plot_projections(
    vectors: np.ndarray,
    labels: Sequence[str],
    layers: Sequence[int],
    path: str | os.PathLike,
    *,
    projection: Projection = "pca",
    title: str = "",
    seed: int = 0,
) -> Path:
    """One panel per layer: ``vectors`` ``(n_layers, n_points, dim)`` projected to 2-D, coloured by
    ``labels`` (a word, a class, a sentence id), with one shared legend."""
    plt = _pyplot()
    n_layers = vectors.shape[0]
    columns = min(4, n_layers)
    rows = -(-n_layers // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.3 * columns, 3.1 * rows + 0.6), squeeze=False, dpi=110)
    labels = [_plain(label) for label in labels]  # user text: "$" would start matplotlib math mode
    title = _plain(title)
    names = list(dict.fromkeys(labels))
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    colors = {name: cmap(i % cmap.N) for i, name in enumerate(names)}
    label_array = np.asarray(labels)
    for k in range(rows * columns):
        ax = axes[k // columns][k % columns]
        if k >= n_layers:
            ax.axis("off")
            continue
        xy = project(vectors[k], projection, seed=seed)
        for name in names:
            mine = label_array == name
            ax.scatter(
                xy[mine, 0], xy[mine, 1], s=18, alpha=0.8, color=colors[name], label=name, edgecolors="none"
            )
        ax.set_title(f"layer {layers[k]}" + (" (embeddings)" if layers[k] == 0 else ""), fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    handles = [plt.Line2D([], [], marker="o", ls="", color=colors[n], label=n) for n in names[:20]]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=9, frameon=False)
    fig.suptitle(title or f"{projection.upper()} of each layer's vectors", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def plot_heatmap(matrix: np.ndarray, layers: Sequence[int], path: str | os.PathLike, *, title: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 4.4), dpi=110)
    image = ax.imshow(matrix, vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(layers)), [str(i) for i in layers])
    ax.set_yticks(range(len(layers)), [str(i) for i in layers])
    ax.set_xlabel("layer")
    ax.set_ylabel("layer")
    if len(layers) <= 13:
        for i in range(len(layers)):
            for j in range(len(layers)):
                ax.text(
                    j,
                    i,
                    f"{matrix[i, j]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if matrix[i, j] < 0.6 else "black",
                )
    fig.colorbar(image, ax=ax, fraction=0.046)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def plot_lines(
    series: Mapping[str, np.ndarray],
    layers: Sequence[int],
    path: str | os.PathLike,
    *,
    title: str,
    ylabel: str,
    xlabel: str = "layer (0 = embeddings)",
    best: int | None = None,
) -> Path:
    """One line per series over the layers; ``best``: a layer to mark (a star on every series)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    for name, values in series.items():
        ax.plot(list(layers), values, "o-", label=name)
        if best is not None and best in layers:
            k = list(layers).index(best)
            ax.plot([best], [values[k]], "*", color="#d62728", markersize=16, zorder=5)
    if best is not None:
        ax.axvline(best, color="#d62728", lw=1, ls="--", alpha=0.6, label=f"pick: hidden state {best}")
    ax.set_xticks(list(layers))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def plot_word_projections(
    stacks: Iterable[LayerStack],
    words: Sequence[str],
    path: str | os.PathLike,
    *,
    projection: Projection = "pca",
    model: str | None = None,
    seed: int = 0,
) -> Path:
    """Every occurrence of ``words`` in ``stacks`` (LayerStacks, e.g. ``enc.extract(texts)`` or a
    token-level store), one panel per layer."""
    check_choice("projection", projection, PROJECTIONS)
    points, labels, held = word_occurrences(stacks, words)
    missing = sorted({w.lower() for w in words} - set(labels))
    shown = ", ".join(sorted(set(labels)))
    title = f"{projection.upper()} per layer of {shown} ({points.shape[1]} occurrences" + (
        f"; {model})" if model else ")"
    )
    if missing:
        title += f"; not found: {', '.join(missing)}"
    return plot_projections(points, labels, held, path, projection=projection, title=title, seed=seed)
