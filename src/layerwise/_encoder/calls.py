"""From a call's inputs to the engine's stream: the :class:`~layerwise._engine.call.Call` value checked and
settled against the model, the inputs tokenised in blocks beside the forward, warnings once a call.

Inputs run in blocks. On a GPU the first holds one batch's worth, so the device starts at once; each
next one is tokenised on a thread (the fast tokenizer releases the GIL) while this one runs, and
holds :data:`GROWTH` times as many, up to :data:`MAX_BLOCK` batches. On a CPU, where the forward
needs the cores the tokenizer would use, blocks of :data:`MAX_BLOCK` batches are tokenised in line.
Bad input in the first block fails before the stream starts; an error in a later block is raised
at its turn, after the results of the inputs before it: errors arrive in input order. Windows
(``long_texts="window"``), taps and the padded forward run on per-input objects (``Engine.run_inputs``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .._engine.call import Call
from .._engine.host_copy import RESULT_DTYPES
from .._features.device_pool import DevicePlan
from .._features.layers import LayerSpec, resolve_layers
from .._features.plan import OutputPlan
from .._inputs.ahead import ahead
from .._inputs.block import EncodedBlock
from .._inputs.raw import RawInputs
from .._inputs.reports import report_blocks
from .._inputs.windows import check_window_memory, check_window_options
from .._model.forward.hooks import DECODER_TAPS, check_family_taps, check_taps, tap_paths
from .._results import LayerStack
from .._settings.long_texts import LONG_TEXTS, LongTexts
from .._settings.settings import METHODS, FinalNorm, Method, check_final_norm
from ..errors import OptionError, check_choice

if TYPE_CHECKING:
    from .._engine.engine import Engine
    from .._inputs.encoding import InputEncoder
    from .._model.handle import ModelHandle


class Encoder(Protocol):
    """What these functions read of the Encoder (core.py), typed by this interface so that this
    module does not import core.py back."""

    @property
    def n_hidden_states(self) -> int: ...

    @property
    def max_length(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def method(self) -> Method: ...
    @property
    def device(self) -> Any: ...
    @property
    def final_norm(self) -> FinalNorm: ...

    hidden_size: int
    is_decoder: bool
    models: ModelHandle
    model_type: str
    name: str
    engine: Engine
    inputs: InputEncoder


MAX_BLOCK = 16  # batches' worth of inputs in one block, at most
GROWTH = 4  # each block holds this many times its predecessor's inputs (fewer, larger tokenizer calls)


def make_call(
    encoder: Encoder,
    layers: LayerSpec = "all",
    method: Method | None = None,
    taps: Sequence[str] = (),
    long_texts: LongTexts = "truncate",
    stride: int | None = None,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    final_norm: FinalNorm | None = None,
    dtype: str = "float32",
    device_pool: DevicePlan | None = None,
) -> Call:
    """A call's options checked and settled against ``encoder`` (layers resolved; None: the
    Encoder's method and final norm), before any work."""
    layer_ids = resolve_layers(layers, encoder.n_hidden_states)
    check_choice("dtype", dtype, tuple(RESULT_DTYPES))
    method = encoder.method if method is None else method
    check_choice("method", method, METHODS)
    checked = check_taps(taps)
    if encoder.is_decoder and set(checked) - set(DECODER_TAPS):
        own = [tap for tap in DECODER_TAPS if tap in tap_paths(encoder.model_type)]
        raise OptionError(
            f"taps={list(checked)!r}: a decoder LM ({encoder.model_type}) has no module for "
            "attention_output or intermediate (they are the BERT layout's); "
            + (f"its taps are {', '.join(own)}" if own else "layerwise knows no taps of this family")
        )
    check_family_taps(encoder.model_type, checked)
    check_choice("long_texts", long_texts, LONG_TEXTS)
    check_window_options(long_texts, stride, encoder.max_length)
    return Call(
        layer_ids,
        method,
        checked,
        long_texts,
        stride,
        batch_size,
        max_tokens,
        call_final_norm(encoder, final_norm),
        device_pool,
        dtype,
    )


def plan_call(encoder: Encoder, settled: OutputPlan) -> Call:
    """The engine's call for a settled plan: its hidden states, long texts and final norm; a
    sentence or word plan is pooled, fused and normalised on the model's device
    (_features/device_pool.py): only its results cross to the host, and the stacks carry them
    (``pooled``), no token states."""
    n = encoder.n_hidden_states
    on_device = None
    if settled.level in ("sentence", "word") and settled.mode is not None:
        on_device = DevicePlan(
            settled.level, settled.mode, settled.special_tokens, settled.fuse, settled.normalize, n
        )
    return make_call(
        encoder,
        settled.hidden_states(n),
        long_texts=settled.long_texts,
        stride=settled.stride,
        final_norm=settled.final_norm,
        device_pool=on_device,
    )


def call_final_norm(encoder: Encoder, value: FinalNorm | None) -> FinalNorm:
    """A call's final norm: its own, else the Encoder's; checked against the model (final_norm.py)."""
    if value is None:
        return encoder.final_norm
    check_final_norm(value)
    encoder.models.check_final_norm(value)
    return value


def settled_plan(encoder: Encoder, plan: OutputPlan) -> OutputPlan:
    """``plan`` with its final norm settled (the Encoder's default where it says none) and checked
    against the model: refused by name where the model cannot honour it."""
    models = encoder.models
    settled = plan.with_final_norm(encoder.final_norm, takes=models.takes_final_norm, name=models.described)
    if settled.final_norm is not None:
        models.check_final_norm(settled.final_norm)
    return settled


def stream_stacks(
    encoder: Encoder, call: Call, raw: RawInputs, progress: bool | None, report: bool
) -> Iterator[tuple[int, LayerStack]]:
    """``(input index, LayerStack)`` of ``raw`` as batches finish (see the module's docstring)."""
    engine = encoder.engine
    if engine.blockwise(call):
        return engine.run_block_stacks(blocks_ahead(encoder, raw, report), call, progress, len(raw))
    if call.long_texts == "window":
        check_window_memory(raw, len(call.layers), encoder.hidden_size)
    block = encoder.inputs.encode_block(raw, truncate=call.long_texts == "truncate")
    report_blocks([block], len(raw), encoder.max_length, truncation=report)
    return engine.run_inputs(block.items(), call, progress)


def stream_batches(
    encoder: Encoder, call: Call, raw: RawInputs, progress: bool | None
) -> Iterator[tuple[EncodedBlock, Any, Any]]:
    """``Engine.run_blocks`` over ``raw``'s blocks: ``(block, rows, Rows)`` per batch, for a
    sentence or word plan made on the device (``call.device_pool``). Needs
    ``encoder.engine.blockwise(call)``. A sentence pool that reads no word ids tokenises lean (no
    offsets, no word ids: the results expose neither)."""
    plan = call.device_pool
    assert plan is not None
    lean = plan.level == "sentence" and (plan.special_tokens == "include" or plan.pool == "cls")
    blocks = blocks_ahead(encoder, raw, True, detailed=not lean)
    return encoder.engine.run_blocks(blocks, call, progress, len(raw))


def blocks_ahead(
    encoder: Encoder, raw: RawInputs, report: bool, *, detailed: bool = True
) -> Iterator[EncodedBlock]:
    """``raw`` tokenised in blocks, the first now, each next one on a thread while the caller runs
    this one; the truncation and empty-word warnings once, for the whole call, after the last."""
    # on a CPU the tokenizer and the forward each keep every core busy: tokenising beside the
    # forward only makes them take turns (it was slower on 2 cores), so there each block is
    # tokenised in line, and the blocks are large from the first
    beside = encoder.device.type != "cpu"
    largest = MAX_BLOCK * encoder.batch_size
    step = encoder.batch_size if beside else largest
    bounds, start = [], 0
    while start < len(raw):
        bounds.append((start, min(len(raw), start + step)))
        start, step = start + step, min(GROWTH * step, largest)

    def encode(bound: tuple[int, int]) -> EncodedBlock:
        lo, hi = bound
        return encoder.inputs.encode_block(_part(raw, lo, hi), first=lo, detailed=detailed)

    first = encode(bounds[0]) if bounds else None  # bad input in the first block fails here

    def run() -> Iterator[EncodedBlock]:
        seen: list[EncodedBlock] = []
        if first is not None:
            seen.append(first)
            yield first
        rest = ahead(bounds[1:], encode) if beside else ((bound, encode(bound)) for bound in bounds[1:])
        for _, block in rest:
            seen.append(block)
            yield block
        report_blocks(seen, len(raw), encoder.max_length, truncation=report)

    return run()


def _part(raw: RawInputs, lo: int, hi: int) -> RawInputs:
    pairs = raw.text_pairs[lo:hi] if raw.text_pairs is not None else None
    words = raw.words[lo:hi] if raw.words is not None else None
    return RawInputs(raw.texts[lo:hi], pairs, words, raw.field)
