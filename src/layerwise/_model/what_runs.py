"""What will run for a model, said before any weight is read (``layerwise info -m``): its kind
(families.py), the path its forward takes, whether it streams, its taps and its final norm."""

from __future__ import annotations

from typing import Any

from ..errors import ModelLoadError
from .families import kind_of
from .forward.hooks import tap_paths
from .forward.packed import unpackable
from .forward.packed_decoder import PACKED_TAPS, runs_on_modules, unpackable_decoder
from .streaming.support import check_streamable


def describe(config: Any) -> dict[str, Any]:
    """What will run for ``config``, before any weight is read: its kind, the path (``packed``: our
    unpadded forward; ``general``: transformers' own forward of padded batches), whether it
    streams layer by layer, its sub-layer taps and its final norm (``layerwise info -m``)."""
    kind = kind_of(config)
    model_type = str(config.model_type)
    decoder = kind == "decoder"
    why_not = unpackable_decoder(config) if runs_on_modules(config) else unpackable(config)
    try:
        check_streamable(config, model_type)
        streams: str = "yes"
    except ModelLoadError:
        streams = "no: load it in memory"
    taps = sorted(tap_paths(model_type))
    if decoder:
        taps = [t for t in taps if t in ("attention_probs", *PACKED_TAPS)]
        final_norm = "found by name and checked against transformers at load"
        if why_not is None:
            final_norm = "yes: final_norm True, False or 'all'"
    else:
        final_norm = (
            "not an encoder's option: states as transformers returns them (T5's and ModernBERT's last "
            "after their own norm)"
        )
    return {
        "model_type": model_type,
        "kind": "encoder of an encoder-decoder" if kind == "encoder-decoder" else kind,
        "layers": int(config.num_hidden_layers),
        "hidden_size": int(config.hidden_size),
        "path": "packed" if why_not is None else "general",
        "streams": streams,
        "taps": ", ".join(taps) or "none (their module names are not in layerwise's table)",
        "final_norm": final_norm,
        "pairs": "no (join the texts yourself)" if decoder else "where the tokenizer has a pair template",
    }
