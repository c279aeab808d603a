"""How a streamed model's blocks run, settled once before its forward is built: how many tokens a
block holds, how many a batch, how many batches run at once, and where the block's residual stream
waits between layers.

The block is ``stream_block_tokens`` when given, or what the memory budget (``max_device_memory``)
holds after two units' weights and the running batches' work, or :data:`DEFAULT_BLOCK_TOKENS`. On a
GPU whose budget cannot hold the block's residual stream, the stream waits in pinned host memory
and the budget holds only the running batch's (residual.py). :func:`plan_stream` reads nothing but
its arguments: the settings, the model's costs (:class:`StreamShape`) and the memory free on the
host; forward.py runs the plan it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..._settings.placement import parse_bytes
from ...errors import OptionError

if TYPE_CHECKING:
    from ..._settings.settings import Settings

DEFAULT_BLOCK_TOKENS = 32768  # weights read once per 32,768 tokens: a small share of their compute
HOST_SHARE = 0.8  # of the host's free memory, what a block's residual stream may take


@dataclass(frozen=True)
class StreamShape:
    """What a streamed model costs, in bytes. ``weights``: two units' (the running one and the one
    read ahead). Per token of a block: ``state``, its residual stream (its word-table row takes as
    much again); ``held``, what stays on the device while the stream waits in host memory (ids,
    positions and text groups, a decoder's rotary embeddings). Per token of a running batch:
    ``work``, its working activations (queries, keys, values, context, the feed-forward's inner
    width twice). ``vocab``: the word table's rows."""

    weights: int
    state: int
    work: int
    held: int
    vocab: int


@dataclass(frozen=True)
class StreamPlan:
    """How a streamed model's blocks run: ``block_tokens`` real tokens a block, batches of at most
    ``batch_tokens``, ``forwards`` batches of a layer at once (a CPU's concurrent forwards), the
    residual stream on the ``"device"`` or in ``"host"`` memory between layers."""

    block_tokens: int
    batch_tokens: int
    forwards: int
    residual: Literal["device", "host"] = "device"


def plan_stream(
    settings: Settings,
    shape: StreamShape,
    *,
    on_cuda: bool,
    host_free: int,
    max_length: int,
    max_tokens: int,
    forwards: int,
) -> StreamPlan:
    """The plan for a model of ``shape``: the block ``stream_block_tokens`` when given, else what
    ``max_device_memory`` holds, else :data:`DEFAULT_BLOCK_TOKENS`; batches never larger than a
    block or than the budget allows; the concurrent batches down to one where the budget holds
    only one. On a GPU (``on_cuda``) whose budget holds a smaller block than that, the residual
    stream waits in host memory (``host_free`` bytes free there) and the budget sizes the batch
    alone; a given block that fits neither way is refused, naming the sizes and the fix."""
    budget = settings.max_device_memory
    wanted = settings.stream_block_tokens or DEFAULT_BLOCK_TOKENS
    if budget is None:
        return StreamPlan(wanted, min(max_tokens, wanted), forwards)
    size = parse_bytes(budget, "max_device_memory")
    try:
        block, batch = _fit(shape, size, budget, max_length, max_tokens, forwards)
    except OptionError:
        if forwards == 1:
            raise
        forwards = 1  # the batches one at a time, then (the error, if any, is about one)
        block, batch = _fit(shape, size, budget, max_length, max_tokens, forwards)
    # (a budget short of one text's stream on the device is short of it with the stream on the host)
    if on_cuda and block < wanted:
        try:
            host = _host_batch(shape, size, budget, max_length, max_tokens, wanted, host_free)
        except OptionError:
            if settings.stream_block_tokens:
                raise
        else:
            return StreamPlan(wanted, min(host, wanted), 1, "host")
        # no default-sized block with the stream on the host: the smaller block the device holds
    given = settings.stream_block_tokens
    if given is not None and given > block:  # a block the budget cannot hold would overrun it
        raise OptionError(
            f"stream_block_tokens={given:,} does not fit max_device_memory={budget!r}: after two layers' "
            f"weights and a batch's work it holds a block of {block:,} tokens; give at most that, a "
            "larger budget, or leave stream_block_tokens out"
        )
    block = given or block
    return StreamPlan(block, min(batch, block), forwards)


def _fit(
    shape: StreamShape, budget: int, budget_text: str, max_length: int, max_tokens: int, forwards: int
) -> tuple[int, int]:
    """``(block tokens, batch tokens)`` that ``budget`` bytes hold: two units' weights, the working
    activations of the batches running at once (``forwards``: at most half of what is left, and at
    least one text's each), and the block's residual stream and word-table rows. A budget short of
    one text is refused, with both sizes."""
    work, per_block_token = shape.work * forwards, 2 * shape.state
    left = budget - shape.weights
    batch = min(max_tokens, max(max_length, left // (2 * work)))
    block = (left - batch * work) // per_block_token
    if block < max_length:
        needed = shape.weights + max_length * (work + per_block_token)
        raise OptionError(
            f"max_device_memory={budget_text!r} ({budget:,} bytes) is too small to stream this model: "
            f"two layers' weights take {shape.weights:,} bytes and one text of {max_length} tokens "
            f"{max_length * (work + per_block_token):,} bytes more; give at least {needed:,} bytes"
        )
    return int(block), int(batch)


def _host_batch(
    shape: StreamShape,
    budget: int,
    budget_text: str,
    max_length: int,
    max_tokens: int,
    block: int,
    host_free: int,
) -> int:
    """The batch tokens ``budget`` bytes of device memory hold when a ``block``-token block's
    residual stream waits in host memory: after two units' weights and what stays on the device for
    the whole block (its word-table rows, and ``held`` a token), each batch token takes its working
    activations and four states (its own in and out, the next batch's copied in and the last one's
    copied out meanwhile). Refused, with the sizes, when that is less than one text, or when host
    memory cannot hold the block's stream."""
    held = min(shape.vocab, block) * shape.state + block * shape.held
    per_token = shape.work + 4 * shape.state
    batch = min(max_tokens, (budget - shape.weights - held) // per_token)
    if batch < max_length:
        needed = shape.weights + held + max_length * per_token
        raise OptionError(
            f"max_device_memory={budget_text!r} ({budget:,} bytes) is too small to stream this model with "
            f"the block's residual stream in host memory: two layers' weights take {shape.weights:,} "
            f"bytes, what a block of {block:,} tokens keeps on the device {held:,} bytes, and one text "
            f"of {max_length} tokens {max_length * per_token:,} bytes more; give at least {needed:,} "
            "bytes, or a smaller stream_block_tokens"
        )
    if block * shape.state > HOST_SHARE * host_free:
        most = int(HOST_SHARE * host_free) // shape.state
        raise OptionError(
            f"stream_block_tokens={block:,}: the block's residual stream takes {block * shape.state:,} "
            f"bytes of host memory and {host_free:,} are free; set stream_block_tokens to at most {most:,}"
        )
    return int(batch)
