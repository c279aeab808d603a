"""The numbers behind the explorer's views, as plain functions of LayerStacks.

    token_statistics   per layer and token: norm, cosine to the previous / last layer, drift
    word_projection    every occurrence of some words, projected to 2-D at every layer
    attention_maps     every head's attention of one text at every layer

The page shows exactly what these return; each view prints the call that computes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .._analysis.projection import project, word_sites
from .._analysis.show import layer_norms_and_drift
from .._results import LayerStack

if TYPE_CHECKING:
    from .._encoder import Encoder

STATISTICS = ("norm", "cos_prev", "cos_last", "drift")


def token_statistics(stack: LayerStack) -> dict[str, np.ndarray]:
    """Per held layer and token, each ``(n_layers, n_tokens)`` float64:

    ``norm``      the L2 norm of the token's vector (as ``layerwise show``)
    ``cos_prev``  cosine to the same token one layer down (as ``layerwise show``; NaN for the first)
    ``cos_last``  cosine to the same token in the last held layer (1 there)
    ``drift``     ``||h_l - h_{l-1}||``, how far the vector moved in this layer (NaN for the first)
    """
    norms, cos_prev = layer_norms_and_drift(stack)
    hidden = stack.hidden.astype(np.float64)
    last = hidden[-1]
    dots = np.sum(hidden * last, axis=-1)
    cos_last = dots / np.maximum(norms * norms[-1], 1e-12)
    drift = np.full(norms.shape, np.nan)
    if len(stack.layers) > 1:
        drift[1:] = np.linalg.norm(np.diff(hidden, axis=0), axis=-1)
    return {"norm": norms, "cos_prev": cos_prev, "cos_last": cos_last, "drift": drift}


def word_projection(
    stacks: Sequence[LayerStack], words: Sequence[str], projection: str = "pca", *, seed: int = 0
) -> dict:
    """``layerwise plot``'s per-layer projection, as data: ``points`` ``(n_layers, n, 2)``,
    ``labels`` (the word of each point), ``layers``, ``sites`` (see :func:`word_sites`) and
    ``missing`` (asked-for words with no occurrence)."""
    vectors, labels, layers, sites = word_sites(stacks, words)
    points = np.stack([project(vectors[k], projection, seed=seed) for k in range(len(layers))])  # type: ignore[arg-type]
    missing = sorted({w.strip().lower() for w in words if w.strip()} - set(labels))
    return {"points": points, "labels": labels, "layers": layers, "sites": sites, "missing": missing}


def attention_maps(
    encoder: Encoder, text: str, text_pair: str | None = None
) -> tuple[LayerStack, np.ndarray]:
    """One text's attention at every layer: the LayerStack (all hidden states) and
    ``(n_layers, n_heads, n_tokens, n_tokens)`` float32, row = the attending token. A text over the
    model maximum is truncated (attention cannot be stitched across windows; ``stack.truncated``)."""
    stacks = encoder.extract(
        [text], text_pairs=None if text_pair is None else [text_pair], taps=["attention_probs"]
    )
    stack = stacks[0]
    return stack, np.asarray(stack.taps["attention_probs"])
