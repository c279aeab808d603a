"""Whether a model fits where it runs. ``streaming=None`` (the default) loads a model whole when its
weights fit in the device's free memory, and streams it layer by layer (streaming/forward.py) when they do
not and it can be streamed: the weights are counted from the checkpoint's headers (safetensors,
GGUF) before anything is read, in the dtype the model will run in."""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..._host.memory import available_memory
from ..._settings.placement import parse_bytes
from ..._settings.settings import Settings
from ...errors import ModelLoadError, OptionError

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
    device's free memory, or in ``max_device_memory`` when given, and the model can be streamed
    (said in a warning either way; a cap the weights exceed on a model that cannot stream is
    refused: it would be ignored). A streaming option where nothing streams is refused too."""
    _check_used(settings)
    if settings.streaming is not None:
        return settings.streaming
    if settings.device_map is not None or settings.quantize != "none" or not settings.packed:
        return False  # placed by accelerate, or the padded forward asked for: never streamed
    needed = weights_bytes(source, dtype)
    free = free_bytes(device)
    cap = (
        None
        if settings.max_device_memory is None
        else parse_bytes(settings.max_device_memory, "max_device_memory")
    )
    room = free if cap is None else min(free, cap)
    if needed is None or needed <= WEIGHTS_SHARE * room:
        if settings.stream_block_tokens is not None:  # said, not silently dropped
            logger.warning(
                "model %s: stream_block_tokens=%d is not used: the weights fit, so the model is loaded "
                "whole (streaming=True streams it anyway)",
                name,
                settings.stream_block_tokens,
            )
        return False
    from .support import check_streamable

    in_dtype = str(dtype).removeprefix("torch.")
    where = (
        f"the {room:,} bytes free on {device}"
        if cap is None or cap >= free
        else f"max_device_memory={cap:,} bytes"
    )
    sizes = f"its weights ({needed:,} bytes in {in_dtype}) do not fit in {where}"
    try:
        check_streamable(config, name)
    except ModelLoadError as exc:
        if cap is not None and cap < free:  # loading it whole would ignore the cap the user set
            raise ModelLoadError(
                f"model {name!r}: {sizes}, and it cannot be streamed ({exc}). Raise max_device_memory "
                "above the weights, or leave it out to load the model whole"
            ) from None
        logger.warning("model %s: %s, and it cannot be streamed (%s); loading it whole", name, sizes, exc)
        return False
    logger.warning("model %s: %s: streaming it layer by layer (streaming=False loads it whole)", name, sizes)
    return True


def _check_used(settings: Settings) -> None:
    """Refuse a streaming option the run would not read: a block size where nothing streams (a
    device map, quantised weights, the padded forward, streaming=False), a memory cap where the
    model is loaded whole without a device map (streaming=False)."""
    never = settings.streaming is False or settings.device_map is not None or settings.quantize != "none"
    never = never or not settings.packed
    if settings.stream_block_tokens is not None and never:
        raise OptionError(
            f"stream_block_tokens={settings.stream_block_tokens} sizes a streamed model's blocks, and "
            f"with {_why_whole(settings)} nothing streams: leave it out"
        )
    if settings.max_device_memory is not None and settings.streaming is False and settings.device_map is None:
        raise OptionError(
            f"max_device_memory={settings.max_device_memory!r} is the budget of a streamed model or of a "
            "device map, and with streaming=False the model is loaded whole: leave it out, or let the "
            "model stream (streaming=True, or leave streaming out: then it streams when the weights "
            "exceed the budget)"
        )


def _why_whole(settings: Settings) -> str:
    if settings.streaming is False:
        return "streaming=False"
    if settings.device_map is not None:
        return f"device_map={settings.device_map!r}"
    if settings.quantize != "none":
        return f"quantize={settings.quantize!r}"
    return "packed=False"
