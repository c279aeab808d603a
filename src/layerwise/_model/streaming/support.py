"""What the layer-streamed forward (streaming/forward.py) runs: the BERT-family encoders the light model
holds, and the decoder families below; anything else is refused by name."""

from __future__ import annotations

from typing import Any

from ...errors import ModelLoadError
from ..families import is_decoder_config
from ..forward.packed_decoder import PACKED_DECODER_TYPES, PACKED_ENCODER_TYPES_ON_MODULES

# every decoder the packed forward runs streams: the same layers, run one at a time
STREAMED_DECODER_TYPES = PACKED_DECODER_TYPES
# encoders streamed on their own modules, as the decoders are (decoder.py)
STREAMED_ON_MODULES = STREAMED_DECODER_TYPES + PACKED_ENCODER_TYPES_ON_MODULES


def check_streamable(config: Any, name: str) -> None:
    """Refuse an architecture the streamed forward does not run, naming the ones it does."""
    from ..forward.packed import PACKED_MODEL_TYPES
    from ..loading.light import light_unsupported

    if is_decoder_config(config) or config.model_type in STREAMED_ON_MODULES:
        reason = None if config.model_type in STREAMED_ON_MODULES else f"model type {config.model_type!r}"
    else:  # the streamed encoder runs the light model's modules (light.py)
        reason = light_unsupported(config)
    if reason is not None:
        detail = "" if reason.startswith("model type") else f" with {reason}"
        raise ModelLoadError(
            f"model {name!r} is a {config.model_type!r} model{detail}, which layerwise does not stream yet; "
            f"it streams the encoders {', '.join(PACKED_MODEL_TYPES + PACKED_ENCODER_TYPES_ON_MODULES)} "
            "and the decoders "
            f"{', '.join(STREAMED_DECODER_TYPES)}. Load it in memory (streaming=False)"
        )
