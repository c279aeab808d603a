"""A model opened for streaming: its checkpoint found (safetensors, or a GGUF file de-quantised
tensor by tensor), its family's skeleton built (encoder.py, decoder.py); what cannot be streamed is
refused, naming the fix (support.py)."""

from __future__ import annotations

from typing import Any

import torch

from ...errors import ModelLoadError
from ..forward.packed_decoder import runs_on_modules
from ..loading.gguf_files import gguf_parts
from ..loading.light import base_prefix
from .checkpoint import Checkpoint, Weights, missing_weights
from .model import StreamedModel
from .support import check_streamable


def load_streamed(
    source: str, name: str, config: Any, dtype: torch.dtype, device: torch.device
) -> StreamedModel:
    """The streamed model of ``source`` (its weights stay in the checkpoint)."""
    check_streamable(config, name)
    if gguf_parts(source) is not None:  # de-quantised tensor by tensor, as each layer is read
        from .gguf_checkpoint import GgufCheckpoint

        checkpoint: Weights = GgufCheckpoint(source, config)
    else:
        checkpoint = Checkpoint.find(source, name)
    stored = checkpoint.names()
    if runs_on_modules(config):  # the decoders and ModernBERT: on their own modules
        from .decoder import StreamedDecoder

        return _complete(StreamedDecoder(config, checkpoint, name, dtype, device), name)
    from .encoder import StreamedEncoder

    base = base_prefix(config, stored)
    if base is None:
        raise ModelLoadError(
            f"model {name!r}: its checkpoint does not hold every weight of the encoder under the model's "
            "names; load it in memory (streaming=False), or save it again with model.save_pretrained(folder)"
        )
    pooler = f"{base}pooler.dense.weight" in stored and config.model_type != "electra"
    return _complete(StreamedEncoder(config, checkpoint, base, dtype, device, pooler=pooler), name)


def _complete(model: StreamedModel, name: str) -> StreamedModel:
    """``model``, once its checkpoint is known to hold every weight its units read, each of the shape
    and kind its config says, and no weight of the model's own that its config has no place for (a
    layer more than ``num_hidden_layers``): else a named refusal now, as the in-memory load refuses,
    not a wrong model or a raw error midway through a run."""
    from ..loading.weights_checks import check_unused, unused_weights

    missing_weights(model.checkpoint, model.stored_names(), name)
    local = set(model.skeleton.state_dict())
    check_unused(unused_weights(sorted(model.checkpoint.names()), local, model.prefix), name)
    if isinstance(model.checkpoint, Checkpoint):  # a GGUF file's tensors are checked as they de-quantise
        expected = {model.prefix + k: v for k, v in model.skeleton.state_dict().items()}
        model.checkpoint.check_shapes({k: expected[k] for k in model.stored_names()}, name)
    return model
