"""A tokens x layers table for the terminal: how each token's vector changes through the layers."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from rich.table import Table

from .._results import LayerStack


def layer_norms_and_drift(stack: LayerStack) -> tuple[np.ndarray, np.ndarray]:
    """Per layer and token: the L2 norm, and the cosine to the same token one row up in
    ``stack.layers`` (NaN for the first row). Shapes ``(n_layers, n_tokens)``."""
    hidden = stack.hidden.astype(np.float64)
    norms = np.linalg.norm(hidden, axis=-1)
    cosine = np.full(norms.shape, np.nan)
    if len(stack.layers) > 1:
        dots = np.sum(hidden[1:] * hidden[:-1], axis=-1)
        cosine[1:] = dots / np.maximum(norms[1:] * norms[:-1], 1e-12)
    return norms, cosine


def _short(cosine: float) -> str:
    """0.92 -> '.92', -0.12 -> '-.12': narrow enough for a 7-layer table in 80 columns."""
    return f"{cosine:.2f}".replace("0.", ".", 1) if abs(cosine) < 1 else f"{cosine:.1f}"


def layer_table(stack: LayerStack, *, model: str, display: Callable[[str], str] | None = None) -> Table:
    """``display``: a token's piece as a person reads it (_inputs/display.py); a leading or trailing
    space is shown by quoting the token."""
    norms, cosine = layer_norms_and_drift(stack)
    shown = [_quoted(display(t)) if display is not None else t for t in stack.tokens]
    table = Table(
        title=f"{model}: {stack.n_tokens} tokens x {stack.n_held} hidden states",
        caption="cell: L2 norm, then cosine to the previous column's vector of the same token. "
        "L0 = embedding output, Li = output of layer i.",
        caption_justify="left",
    )
    # no column may shrink to nothing on a narrow console: the caller widens the console instead
    table.add_column("#", justify="right", style="dim", no_wrap=True)
    table.add_column("token", style="bold", no_wrap=True, min_width=max(len(t) for t in shown))
    if stack.text_pair is not None:
        table.add_column("seg", justify="right", style="dim", no_wrap=True)
    for layer in stack.layers:
        table.add_column(f"L{layer}", justify="right", no_wrap=True)
    for t, token in enumerate(shown):
        cells = [str(t), token]
        if stack.text_pair is not None:
            cells.append(str(int(stack.segment_ids[t])))
        for k in range(stack.n_held):
            cos = cosine[k, t]
            cells.append(f"{norms[k, t]:.1f}" + ("" if np.isnan(cos) else f" {_short(cos)}"))
        table.add_row(*cells)
    return table


def _quoted(text: str) -> str:
    return repr(text) if text != text.strip() or not text else text
