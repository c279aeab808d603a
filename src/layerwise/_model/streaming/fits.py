"""Whether a model fits where it runs. ``streaming=None`` (the default) loads a model whole when its
weights fit in the device's free memory, and streams it layer by layer (streaming/forward.py) when they do
not and it can be streamed: the weights are counted from the checkpoint's headers (safetensors,
GGUF) before anything is read, in the dtype the model will run in."""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..._host.memory import available_memory
from ..._settings.settings import Settings
from ...errors import ModelLoadError

logger = logging.getLogger("layerwise")

# the share of the free memory the weights may take: the rest is the forward's activations, the
# tokenizer, the results
WEIGHTS_SHARE = 0.8


def free_bytes(device: torch.device) -> int:
    """The memory free on ``device`` now: a GPU's (torch.cuda.mem_get_info), else the system's
    available memory (MemAvailable)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return available_memory()


def weights_bytes(source: str, dtype: torch.dtype) -> int | None:
    """What the model's weights take in ``dtype``, from the checkpoint's headers (nothing is read
    but them); None when the weights are neither safetensors nor a GGUF file."""
    size = torch.empty((), dtype=dtype).element_size()
    if source.endswith(".gguf"):
        import gguf

        return sum(int(t.n_elements) for t in gguf.GGUFReader(source).tensors) * size
    from .checkpoint import Checkpoint

    try:
        return Checkpoint.find(source, source).element_count() * size
    except Exception:  # no safetensors, or a damaged file: the load itself says what is wrong
        return None


def resolve_streaming(
    settings: Settings, source: str, config: Any, dtype: torch.dtype, device: torch.device, name: str
) -> bool:
    """``settings.streaming`` when it says; else (None) whether the weights do not fit in the
    device's free memory and the model can be streamed (said in a warning either way)."""
    if settings.streaming is not None:
        return settings.streaming
    if settings.device_map is not None or settings.quantize != "none" or not settings.packed:
        return False  # placed by accelerate, or the padded forward asked for: never streamed
    needed = weights_bytes(source, dtype)
    free = free_bytes(device)
    if needed is None or needed <= WEIGHTS_SHARE * free:
        return False
    from .support import check_streamable

    in_dtype = str(dtype).removeprefix("torch.")
    sizes = f"its weights ({needed:,} bytes in {in_dtype}) do not fit in the {free:,} bytes free on {device}"
    try:
        check_streamable(config, name)
    except ModelLoadError as exc:
        logger.warning("model %s: %s, and it cannot be streamed (%s); loading it whole", name, sizes, exc)
        return False
    logger.warning("model %s: %s: streaming it layer by layer (streaming=False loads it whole)", name, sizes)
    return True
