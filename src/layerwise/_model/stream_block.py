"""How large a streamed model's block of texts is, and where its residual stream waits between
layers: the block ``stream_block_tokens`` when given, or what the memory budget
(``max_device_memory``) holds after two units' weights and one batch's work, or
:data:`DEFAULT_BLOCK_TOKENS`. On a GPU whose budget cannot hold the block's residual stream, the
stream waits in pinned host memory and the budget holds only the running batch's
(stream_residual.py); streamed.py runs the blocks."""

from __future__ import annotations

from typing import Any

import torch

from .._memory import available_memory
from .._placement import parse_bytes
from ..errors import OptionError
from .stream_residual import Residual
from .streamed import StreamedForward

DEFAULT_BLOCK_TOKENS = 32768  # weights read once per 32,768 tokens: a small share of their compute
HOST_SHARE = 0.8  # of the host's free memory, what a block's residual stream may take


def block_tokens(
    forward: StreamedForward | None, settings: Any, max_length: int, max_tokens: int, streams: int = 1
) -> tuple[int | None, int, int]:
    """A streamed model's ``(block tokens, batch tokens, streams)``: the block
    ``stream_block_tokens`` when given, else what ``max_device_memory`` holds, else
    :data:`DEFAULT_BLOCK_TOKENS`; batches never larger than a block or than the budget allows; the
    concurrent batches down to one where the budget holds only one. On a GPU whose budget holds a
    smaller block than that, ``forward``'s residual stream is put in host memory and the budget
    sizes the batch alone (a given block that fits neither way is refused). ``(None, max_tokens,
    streams)`` when not streamed."""
    if forward is None:
        return None, max_tokens, streams
    budget = settings.max_device_memory
    wanted = settings.stream_block_tokens or DEFAULT_BLOCK_TOKENS
    if budget is None:
        return wanted, min(max_tokens, wanted), streams
    size = parse_bytes(budget, "max_device_memory")
    try:
        block, batch = forward.fit(size, budget, max_length, max_tokens, streams)
    except OptionError:
        if streams == 1:
            raise
        streams = 1  # the batches one at a time, then (the error, if any, is about one)
        block, batch = forward.fit(size, budget, max_length, max_tokens, streams)
    # (a budget short of one text's stream on the device is short of it with the stream on the host)
    if forward.device.type == "cuda" and block < wanted:
        try:
            host = host_batch(forward, size, budget, max_length, max_tokens, wanted)
        except OptionError:
            if settings.stream_block_tokens:
                raise
        else:
            forward.residual = Residual(forward.device, on_host=True)
            return wanted, min(host, wanted), 1
        # no default-sized block with the stream on the host: the smaller block the device holds
    block = settings.stream_block_tokens or block
    return block, min(batch, block), streams


def host_batch(
    forward: StreamedForward, budget: int, budget_text: str, max_length: int, max_tokens: int, block: int
) -> int:
    """The batch tokens ``budget`` bytes of device memory hold when a ``block``-token block's
    residual stream waits in host memory: after two units' weights and what stays on the device for
    the whole block (its word-table rows, positions and token ids, a decoder's rotary embedding),
    each batch token takes its working activations and four states (its own in and out, the next
    batch's copied in and the last one's copied out meanwhile). Refused, with the
    sizes, when that is less than one text, or when host memory cannot hold the block's stream."""
    weights, stream, work = forward.costs()
    config = forward.skeleton.config
    state = stream // 2  # ``stream`` counts a token's state and its word-table row
    held = min(int(config.vocab_size), block) * state + block * _held_per_token(forward)
    per_token = work + 2 * stream  # its state in and out, the next batch's coming in, the last's going out
    batch = min(max_tokens, (budget - weights - held) // per_token)
    if batch < max_length:
        needed = weights + held + max_length * per_token
        raise OptionError(
            f"max_device_memory={budget_text!r} ({budget:,} bytes) is too small to stream this model with "
            f"the block's residual stream in host memory: two layers' weights take {weights:,} bytes, what a "
            f"block of {block:,} tokens keeps on the device {held:,} bytes, and one text of {max_length} "
            f"tokens {max_length * per_token:,} bytes more; give at least {needed:,} bytes, or a "
            "smaller stream_block_tokens"
        )
    free = available_memory()
    if block * state > HOST_SHARE * free:
        most = int(HOST_SHARE * free) // state
        raise OptionError(
            f"stream_block_tokens={block:,}: the block's residual stream takes {block * state:,} bytes of "
            f"host memory and {free:,} are free; set stream_block_tokens to at most {most:,}"
        )
    return int(batch)


def _held_per_token(forward: StreamedForward) -> int:
    """Device bytes per block token while the stream waits in host memory: three int64 columns
    (ids, positions, text groups) and each rotary embedding's cos and sin (a decoder's: one per
    Gemma 3 layer type, none for GPT-2)."""
    if not forward.rotary_kinds:
        return 24
    config = forward.skeleton.config
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 24 + 2 * head * forward.rotary_kinds * torch.empty((), dtype=forward.dtype).element_size()
