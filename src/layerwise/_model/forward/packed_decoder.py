"""Packed (unpadded) forward for decoder LMs, on the transformers model's own modules.

A batch's real tokens run back to back as one sequence ``(1, N)``, with position ids that restart
at 0 for each text (so rotary or learned positions are each text's own). Everything but attention
is transformers' own code, op for op: embeddings (Gemma's scaling included), norms, rotary
positions, the feed-forward, Qwen 3's query/key norms. Attention is a function registered with
transformers' ``AttentionInterface`` (``config._attn_implementation = "layerwise_packed"``): it cuts
the packed queries, keys and values into per-text grids (texts of similar length share a grid, as
in the encoders' packed forward, packed.py) and runs causal attention there, with
``scaled_dot_product_attention`` or, where the model soft-caps its scores (Gemma 2) or has a
sliding window shorter than a text, the eager formula with those applied. Right padding inside a
grid needs no mask: a real token's causal window ends before any padding.

Hidden states are read with forward hooks installed once on the layers, active only in the thread
that runs a packed forward (streams run several at once on one model), and the forward stops by
raising after the deepest layer asked for. The linear layers run on oneDNN with prepacked weights
where that wins (cpu_gemm.py), through the same per-thread switch.

Supported: the Llama, Mistral, Qwen2/Qwen3 and Gemma/Gemma2/Gemma3 families (``nn.Linear``
projections, ``layers``, rotary positions) and GPT-2 (``h``, learned positions; its ``Conv1D``
projections stay transformers' own). Per-layer sliding windows (Gemma 3, Qwen with
``use_sliding_window``) come with each layer's attention call.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..families import is_decoder_config
from .cpu_gemm import PrepackedLinears
from .hooks import tap_module, tap_paths
from .packed import AttentionGroup, PackedEncoder, plan_groups

ATTENTION = "layerwise_packed"
PACKED_TAPS = ("attn_out", "mlp_out")  # the sub-layer outputs the packed forward records
PACKED_DECODER_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "gpt2",
    "gpt_neox",
    "opt",
    "phi",
    "phi3",
    "olmo",
    "olmo2",
)
# encoders whose layers call transformers' attention interface: packed the same way, with attention
# both ways over each text's grid (ModernBERT's local layers: within their window)
PACKED_ENCODER_TYPES_ON_MODULES = ("modernbert",)
_local = threading.local()  # the packed forward running in this thread, if any


class _Stop(Exception):
    """Control flow, never an error: the deepest layer asked for is done."""


@dataclass
class PackedRun:
    """What one thread's packed forward needs inside transformers' code (the streamed forward,
    streaming/forward.py, runs the layers itself and needs only the groups)."""

    groups: list[AttentionGroup]
    wanted: set[int] = field(default_factory=set)
    stop_after: int = 1 << 30
    states: dict[int, torch.Tensor] = field(default_factory=dict)
    linear: PrepackedLinears | None = None
    taps: tuple[str, ...] = ()  # attn_out, mlp_out of the blocks of hidden states ``wanted`` >= 1
    tapped: dict[str, dict[int, torch.Tensor]] | None = None


@dataclass
class PackedDecoderBatch:
    ids: torch.Tensor  # (N,)
    positions: torch.Tensor  # (N,) 0 … n-1 for each text
    lengths: list[int]
    groups: list[AttentionGroup]


def prepare_decoder_batch(columns: Any, device: torch.device, *, causal: bool = True) -> PackedDecoderBatch:
    """A batch's ids back to back (_inputs/block.py ``TokenColumns``), each text's positions, its
    attention grids: for the packed decoder forward and the streamed one (streaming/forward.py) alike.
    Causal attention needs no key mask (a real token's window ends before any padding); an
    encoder's does."""
    column, groups = plan_groups(columns.lengths, device, key_mask=not causal)
    return PackedDecoderBatch(
        torch.from_numpy(columns.ids).to(device), column.to(device), columns.lengths, groups
    )


def runs_on_modules(config: Any) -> bool:
    """Whether ``config``'s model runs this module's way (its own modules, the packed attention):
    every decoder LM, and the encoders of PACKED_ENCODER_TYPES_ON_MODULES. Among those,
    :func:`unpackable_decoder` says which families it runs."""
    return is_decoder_config(config) or config.model_type in PACKED_ENCODER_TYPES_ON_MODULES


def unpackable_decoder(config: Any) -> str | None:
    """What in ``config`` the packed decoder forward cannot run, or None when it can."""
    if config.model_type not in PACKED_DECODER_TYPES + PACKED_ENCODER_TYPES_ON_MODULES:
        return f"model type {config.model_type!r}"
    return None


def _attend_both_ways(query, key, value, *, scaling, window: int | None, key_mask):
    """Bidirectional attention of one grid ``(B, heads, T, d)`` (an encoder's: ModernBERT), over
    real keys only, each query seeing keys within ``window`` positions where its layer is local."""
    allowed = key_mask  # (B, 1, 1, T) or None: a grid without padding
    t = query.shape[2]
    if window is not None and t > window:
        i = torch.arange(t, device=query.device)
        near = (i[None, :] - i[:, None]).abs() <= window
        allowed = near if allowed is None else allowed & near
    return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling)


def _attend(query, key, value, *, scaling, causal_window: int | None, softcap: float | None):
    """Causal attention of one grid ``(B, heads, T, d)``; keys and values may have fewer heads."""
    groups = query.shape[1] // key.shape[1]
    t = query.shape[2]
    if softcap is None and (causal_window is None or t <= causal_window):
        return F.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scaling, enable_gqa=groups > 1
        )
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # transformers' eager formula
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    i = torch.arange(t, device=query.device)
    allowed = i[None, :] <= i[:, None]
    if causal_window is not None:
        allowed &= i[None, :] > i[:, None] - causal_window
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value)


def packed_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    sliding_window=None,
    softcap=None,
    **kwargs,
):
    """transformers' attention interface for a packed batch: query ``(1, heads, N, d)``, keys and
    values ``(1, kv_heads, N, d)`` -> ``(1, N, heads, d)``."""
    run: PackedRun | None = getattr(_local, "run", None)
    if run is None:
        raise RuntimeError("layerwise's packed attention called outside a packed forward")
    q, k, v = query[0], key[0], value[0]  # (heads, N, d)
    out = q.new_empty(q.shape[1], q.shape[0], q.shape[2])  # (N, heads, d)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    for group in run.groups:
        parts = []
        for x in (q, k, v):
            x = x[:, group.start : group.stop]  # (heads, N_g, d)
            if group.flat is not None:
                grid = x.new_zeros(x.shape[0], group.count * group.width, x.shape[2])
                grid.index_copy_(1, group.flat, x)
                x = grid
            parts.append(x.view(x.shape[0], group.count, group.width, x.shape[2]).transpose(0, 1))
        if getattr(module, "is_causal", True):
            context = _attend(*parts, scaling=scale, causal_window=sliding_window, softcap=softcap)
        else:  # an encoder's layer (ModernBERT): both ways, padding masked; a local layer's window is
            # the config's, as transformers' bidirectional mask reads it (the layer's own is flash's, +1)
            window = module.config.sliding_window if sliding_window is not None else None
            context = _attend_both_ways(*parts, scaling=scale, window=window, key_mask=group.key_mask)
        context = context.transpose(1, 2).reshape(group.count * group.width, q.shape[0], q.shape[2])
        out[group.start : group.stop] = context if group.flat is None else context.index_select(0, group.flat)
    return out[None], None


def decoder_layers(model: Any) -> Any:
    """The decoder's layer list: ``layers`` (Llama and the others), ``h`` (GPT-2), ``decoder.layers``
    (OPT)."""
    found = getattr(model, "layers", None) or getattr(model, "h", None)
    decoder = getattr(model, "decoder", None)
    return found if found is not None or decoder is None else getattr(decoder, "layers", None)


def register_packed_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, packed_attention)


class PackedDecoder:
    """The packed forward of a transformers decoder model (``LlamaModel``, …), on its own modules."""

    def __init__(self, model: Any) -> None:
        register_packed_attention()
        self.model = model
        self.layers: nn.ModuleList = decoder_layers(model)
        self.causal = is_decoder_config(model.config)  # else an encoder's layers (ModernBERT)
        self.linear = PrepackedLinears()
        self._install_hooks()

    @classmethod
    def build(cls, model: Any) -> PackedDecoder | None:
        config = getattr(model, "config", None)
        if config is None or unpackable_decoder(config) is not None:
            return None
        if not isinstance(decoder_layers(model), nn.ModuleList):
            return None
        return cls(model)

    # the hooks and switches stay on the model; they do nothing unless this thread runs a packed forward
    def _install_hooks(self) -> None:
        if getattr(self.model, "_layerwise_packed_hooks", False):
            return
        self.layers[0].register_forward_pre_hook(_record_input, with_kwargs=True)
        model_type = self.model.config.model_type
        for depth, layer in enumerate(self.layers, start=1):
            layer.register_forward_hook(_recorder(depth))
            for tap in PACKED_TAPS:  # what the block's attention and feed-forward add to the stream
                if tap in tap_paths(model_type):  # else refused by name when a call asks for it
                    tap_module(layer, model_type, tap).register_forward_hook(_tap_recorder(tap, depth))
        switch_linears(self.layers)
        self.model._layerwise_packed_hooks = True

    def prepare(
        self, columns: Any, *, device: torch.device, with_token_types: bool = False
    ) -> PackedDecoderBatch:
        """The batch's ids back to back (_inputs/block.py ``TokenColumns``), each text's positions, its
        attention grids (decoders have no token types: ``with_token_types`` is there for the engine's
        one call)."""
        return prepare_decoder_batch(columns, device, causal=self.causal)

    def forward(self, batch: PackedDecoderBatch, layers: Sequence[int]) -> torch.Tensor:
        """Hidden states ``layers`` of the packed batch: ``(len(layers), N, H)``, every one the raw
        residual stream (the engine applies the final norm a call asks for: final_norm.py)."""
        return self.forward_with_taps(batch, layers, ())[0]

    def forward_with_taps(
        self, batch: PackedDecoderBatch, layers: Sequence[int], taps: Sequence[str]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`forward`, and the ``taps`` (of :data:`PACKED_TAPS`) of the blocks behind hidden
        states ``layers`` >= 1: ``{tap: (n, N, H)}``, as hooks on those modules record them."""
        deepest = max(layers)
        n_layers = len(self.layers)
        # all layers: run to the end, where the model applies its final norm; else stop after the deepest
        stop_after = deepest if deepest < n_layers else n_layers + 1
        tapped: dict[str, dict[int, torch.Tensor]] = {t: {} for t in taps}
        run = PackedRun(batch.groups, set(layers), stop_after, {}, self.linear, tuple(taps), tapped)
        switched = attention_implementation(self.model.config, ATTENTION)
        given = {"use_cache": False} if self.causal else {}
        with running_packed(run), switched, contextlib.suppress(_Stop):
            self.model(input_ids=batch.ids[None], position_ids=batch.positions[None], **given)
        states, tapped = run.states, run.tapped or {}
        tap_layers = [i for i in layers if i >= 1]
        taps_out = {t: torch.stack([tapped[t][i] for i in tap_layers]) for t in taps if tap_layers}
        return torch.stack([states[i] for i in layers]), taps_out


@contextmanager
def running_packed(run: PackedRun) -> Iterator[None]:
    _local.run = run
    try:
        yield
    finally:
        _local.run = None


_switch_lock = threading.Lock()
_switched: dict[int, tuple[int, Any]] = {}  # id(config) -> (packed forwards running, the name before)


@contextmanager
def attention_implementation(config: Any, name: str) -> Iterator[None]:
    """The attention implementation the model's layers look up at each call, set while any packed
    forward runs (streams run several at once: the first sets it, the last puts the model's own
    back). A Hugging Face forward of the engine takes the exclusive lock, so it never runs then."""
    key = id(config)
    with _switch_lock:
        count, before = _switched.get(key, (0, None))
        if count == 0:
            before = config._attn_implementation
            config._attn_implementation = name
        _switched[key] = (count + 1, before)
    try:
        yield
    finally:
        with _switch_lock:
            count, before = _switched[key]
            if count == 1:
                config._attn_implementation = before
                del _switched[key]
            else:
                _switched[key] = (count - 1, before)


def _record_input(module: nn.Module, args: tuple, kwargs: dict) -> None:
    run: PackedRun | None = getattr(_local, "run", None)
    if run is None:
        return
    hidden = args[0] if args else kwargs["hidden_states"]
    if 0 in run.wanted:
        run.states[0] = hidden[0]
    if run.stop_after == 0:
        raise _Stop


def _recorder(depth: int):
    def hook(module: nn.Module, args: tuple, output: Any) -> None:
        run: PackedRun | None = getattr(_local, "run", None)
        if run is None:
            return
        if depth in run.wanted:
            hidden = output[0] if isinstance(output, tuple | list) else output
            run.states[depth] = hidden[0]
        if depth >= run.stop_after:
            raise _Stop

    return hook


def _tap_recorder(tap: str, depth: int):
    def hook(module: nn.Module, args: tuple, output: Any) -> None:
        run: PackedRun | None = getattr(_local, "run", None)
        if run is None or tap not in run.taps or depth not in run.wanted or run.tapped is None:
            return
        value = output[0] if isinstance(output, tuple | list) else output
        run.tapped[tap][depth] = value[0]

    return hook


def switch_linears(layers: Iterable[nn.Module]) -> None:
    """Each ``nn.Linear`` of ``layers`` runs on the packed run's prepacked linears (oneDNN, where
    they apply: cpu_gemm.py) inside a packed forward that carries them; ``F.linear`` elsewhere."""
    for layer in layers:
        for module in layer.modules():
            if type(module) is nn.Linear:
                module.forward = types.MethodType(_switched_linear, module)  # type: ignore[method-assign]


def _switched_linear(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward``, on oneDNN with a prepacked weight inside a packed forward."""
    run: PackedRun | None = getattr(_local, "run", None)
    if run is None:
        return F.linear(x, self.weight, self.bias)
    if run.linear is None:
        return F.linear(x, self.weight, self.bias)
    flat = run.linear(x.reshape(-1, x.shape[-1]), self.weight, self.bias)
    return flat.view(*x.shape[:-1], flat.shape[-1])


def packed_forward(model: Any) -> PackedEncoder | PackedDecoder | None:
    """The packed forward of ``model``: the encoders' (packed.py) or the decoders' (this module);
    None where neither runs this architecture."""
    if runs_on_modules(model.config):
        return PackedDecoder.build(model)
    return PackedEncoder.build(model)
