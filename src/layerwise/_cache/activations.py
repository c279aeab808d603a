"""A shard's activations: every requested hidden state (and tap) of its contexts, computed in the
engine's batches and copied into the shard's arrays in the cache's dtype, one cast per hidden state
and batch (the contexts have one length: a batch's packed rows are one reshape from ``(B, T, H)``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._inputs.batches import TokenUnit
from .._results import check_float16_rows
from ..errors import NonFiniteError


def _check_finite(batch: list[int], rows, layers: tuple[int, ...], context_ids: np.ndarray) -> None:
    """The batch's sum was not finite: find the context and hidden state that are not (a sum can
    also overflow with every value finite) and name them."""
    for u, (hidden, _) in zip(batch, rows, strict=True):
        for j, layer in enumerate(layers):
            if not np.isfinite(hidden[j]).all():
                context = int(context_ids[u])
                raise NonFiniteError(
                    f"the model produced NaN or inf in hidden state {layer} of context {context} (row "
                    f"{context} of contexts.i32): with model_dtype='float16' try float32, else check the "
                    "weights",
                    index=context,
                    layer=layer,
                )


def _batch_states(rows: Any, kind: str, j: int, width: int) -> np.ndarray:
    """``(B, T, H)``: state ``j`` of ``kind`` ("resid": the hidden states, else a tap) of a batch's
    contexts, a view of a packed batch's array (one copy of a padded batch's cut rows)."""
    if rows.array is not None:
        stacked = rows.array if kind == "resid" else rows.taps[kind]
        return stacked[j].reshape(len(rows), width, -1)
    return np.stack([(hidden if kind == "resid" else taps[kind])[j] for hidden, taps in rows])


def activations(
    encoder, token_ids: np.ndarray, meta: dict, columns: dict[str, int], context_ids: np.ndarray
) -> dict[str, np.ndarray]:
    """Every requested hidden state of each context, in the cache's dtype: ``{column: (B, T, H)}``."""
    import torch

    zeros = (0,) * token_ids.shape[1]
    units = [TokenUnit(tuple(row.tolist()), zeros) for row in token_ids]
    out = {
        name: np.empty((len(units), token_ids.shape[1], width), dtype=meta["dtype"])
        for name, width in columns.items()
    }
    layers = tuple(meta["layers"])
    taps = tuple(h for h in meta.get("hooks", ["resid"]) if h != "resid")
    sources = [(name, kind, int(j)) for name, (kind, j) in zip(columns, meta["sources"], strict=True)]
    threads = torch.get_num_threads()
    forward = encoder.engine.forward_units(units, layers=layers, final_norm=meta["final_norm"], taps=taps)
    width = token_ids.shape[1]
    for batch, rows in forward:
        if rows.nonfinite:
            _check_finite(batch, rows, layers, context_ids)
        # every context has the same length: the batch's packed rows are (L, B * T, H), one reshape
        # from (B, T, H) per hidden state, and the batch is a run of consecutive contexts
        lo, hi = batch[0], batch[-1] + 1
        assert hi - lo == len(batch) and batch == list(range(lo, hi)), "cache batches are runs"
        torch.set_num_threads(1)  # the concurrent forwards hold the cores; the copy is one pass
        try:
            for name, kind, j in sources:
                value = _batch_states(rows, kind, j, width)
                if meta["dtype"] == "float16":  # inf would be cached for a value past its range
                    names = [f"{name} of context {int(c)}" for c in context_ids[lo:hi].tolist()]
                    check_float16_rows(value, names)
                # torch's cast: vectorised, NumPy's runs element by element
                torch.from_numpy(out[name][lo:hi]).copy_(torch.from_numpy(np.ascontiguousarray(value)))
        finally:
            torch.set_num_threads(threads)
    return out
