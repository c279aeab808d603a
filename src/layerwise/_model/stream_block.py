"""How large a streamed model's block of texts is: given (``stream_block_tokens``), or what the memory
budget (``max_device_memory``) holds after two units' weights and one batch's work, or
:data:`DEFAULT_BLOCK_TOKENS` (streamed.py runs the blocks)."""

from __future__ import annotations

from typing import Any

from .._placement import parse_bytes
from ..errors import OptionError
from .streamed import StreamedForward

DEFAULT_BLOCK_TOKENS = 32768  # weights read once per 32,768 tokens: a small share of their compute


def block_tokens(
    forward: StreamedForward | None, settings: Any, max_length: int, max_tokens: int, streams: int = 1
) -> tuple[int | None, int, int]:
    """A streamed model's ``(block tokens, batch tokens, streams)``: the block
    ``stream_block_tokens`` when given, else what ``max_device_memory`` holds, else
    :data:`DEFAULT_BLOCK_TOKENS`; batches never larger than a block or than the budget allows; the
    concurrent batches down to one where the budget holds only one. ``(None, max_tokens, streams)``
    when not streamed."""
    if forward is None:
        return None, max_tokens, streams
    budget = settings.max_device_memory
    block, batch = DEFAULT_BLOCK_TOKENS, max_tokens
    if budget is not None:
        size = parse_bytes(budget, "max_device_memory")
        try:
            block, batch = forward.fit(size, budget, max_length, max_tokens, streams)
        except OptionError:
            if streams == 1:
                raise
            streams = 1  # the batches one at a time, then (the error, if any, is about one)
            block, batch = forward.fit(size, budget, max_length, max_tokens, streams)
    block = settings.stream_block_tokens or block
    return block, min(batch, block), streams
