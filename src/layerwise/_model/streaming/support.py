"""What the layer-streamed forward (streaming/forward.py) runs: the BERT-family encoders the light model
holds, and every family the packed decoder forward runs on its own modules (the decoders and
ModernBERT: the same layers, run one at a time); anything else is refused by name."""

from __future__ import annotations

from typing import Any

from ...errors import ModelLoadError
from ..families.table import packed_families
from ..forward.packed_decoder import runs_on_modules, unpackable_decoder


def check_streamable(config: Any, name: str) -> None:
    """Refuse an architecture the streamed forward does not run, naming the ones it does."""
    from ..loading.light import light_unsupported

    # on its own modules (decoder.py), else the light model's (encoder.py, light.py)
    reason = unpackable_decoder(config) if runs_on_modules(config) else light_unsupported(config)
    projected = getattr(config, "word_embed_proj_dim", None) not in (None, config.hidden_size)
    if reason is None and config.model_type == "opt" and projected:
        reason = "its embeddings projected to another width (project_in, as OPT-350m)"
    if reason is not None:
        detail = "" if reason.startswith("model type") else f" with {reason}"
        encoders = packed_families("bert") + packed_families("blocks", "encoder")
        raise ModelLoadError(
            f"model {name!r} is a {config.model_type!r} model{detail}, which layerwise does not stream yet; "
            f"it streams the encoders {', '.join(encoders)} "
            "and the decoders "
            f"{', '.join(packed_families('blocks', 'decoder'))}. Load it in memory (streaming=False)"
        )
