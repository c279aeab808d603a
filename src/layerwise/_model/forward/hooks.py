"""Forward hooks on the encoder: layer outputs, sub-layer taps, and stopping early.

Many tutorials read hidden states with ``register_forward_hook`` on each encoder layer instead of
``output_hidden_states=True``. layerwise supports both; this module holds the hook side, plus
:func:`truncated_encoder`, which runs only the first ``depth`` layers so that asking for layer 2 of
a 12-layer model does not pay for layers 3-12.

Sub-layer taps (per encoder layer, recorded for the requested layers >= 1):

    attention_probs    (heads, T, T)  softmax(QK^T / sqrt(d_k) + mask); needs eager attention,
                                      which a replica of the model runs (forward/general.py)
    attention_output   (T, hidden)    the attention block's output after residual + LayerNorm
    intermediate       (T, ffn)       the feed-forward activations after GELU
    attn_out           (T, hidden)    what the attention block adds to the residual stream (before
                                      the add; TransformerLens' hook_attn_out)
    mlp_out            (T, hidden)    what the feed-forward block adds (TransformerLens' hook_mlp_out)

Decoder LMs have attention_probs, attn_out and mlp_out; attn_out and mlp_out come from the packed
forward too (packed_decoder.py). Gemma 2 and 3 normalise each block's output before the add: their
attn_out and mlp_out are the outputs of those norms, what the residual stream receives.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import torch
from torch import nn

from ...errors import OptionError
from ..families.table import families_with_taps, family

Tap = Literal["attention_probs", "attention_output", "intermediate", "attn_out", "mlp_out"]
TAPS: tuple[str, ...] = ("attention_probs", "attention_output", "intermediate", "attn_out", "mlp_out")
DECODER_TAPS: tuple[str, ...] = ("attention_probs", "attn_out", "mlp_out")

# Each family's tap paths are in its row of the family table (families/table.py).
# Which element of a module's tuple output holds the tap (attention modules return (context, probs)).
_TAP_INDEX = {"attention_probs": 1, "attention_output": 0, "intermediate": 0, "attn_out": 0, "mlp_out": 0}


def check_taps(taps: Sequence[str]) -> tuple[str, ...]:
    """Validate sub-layer tap names (a list, each known, none twice)."""
    if isinstance(taps, str):
        raise OptionError(f"taps={taps!r} must be a list of tap names, e.g. taps=[{taps!r}]")
    checked = tuple(taps)
    for tap in checked:
        if tap not in TAPS:
            raise OptionError(f"taps item={tap!r} is not valid; choose one of {', '.join(map(repr, TAPS))}")
    if len(set(checked)) != len(checked):
        raise OptionError(f"taps={checked!r} names a tap more than once")
    return checked


def find_layer_list(model: nn.Module, n_layers: int) -> tuple[str, str] | None:
    """Where the ``nn.ModuleList`` holding the encoder layers is: its owner's path in ``model`` and its
    attribute name; None where there is none (ALBERT shares one layer across depths). A candidate:
    the warm-up checks that its outputs are the hidden states (forward/padded.py).

    Found by shape rather than by name so that every layout works (``encoder.layer`` for
    BERT/RoBERTa/ELECTRA/MPNet, ``transformer.layer`` for DistilBERT, ``layers`` for decoders)."""
    for name, owner in model.named_modules():
        for attr, child in owner.named_children():
            if isinstance(child, nn.ModuleList) and len(child) == n_layers:
                return name, attr
    return None


@contextmanager
def truncated_encoder(owner: nn.Module, attr: str, depth: int) -> Iterator[None]:
    """Run only the first ``depth`` layers of ``owner.attr`` inside the block. ``owner`` belongs to
    a replica (replica.py): the user's model keeps its layer list."""
    layer_list = getattr(owner, attr)
    if depth >= len(layer_list):
        yield
        return
    setattr(owner, attr, nn.ModuleList(list(layer_list)[:depth]))
    try:
        yield
    finally:
        setattr(owner, attr, layer_list)


def tap_paths(model_type: str) -> dict[str, str]:
    """The taps of ``model_type`` and the sub-module of a layer each reads; none for a family
    whose module names are not in the table (hidden states need none)."""
    row = family(model_type)
    return dict(row.taps) if row is not None else {}


def _families_with_taps() -> str:
    known = ", ".join(families_with_taps())
    return (
        f"taps need a family's module names, and layerwise knows those of {known} (docs/models.md); "
        "hidden states need none"
    )


def check_family_taps(model_type: str, taps: Sequence[str]) -> None:
    """Refuse, before any work, a tap ``model_type``'s layers have no module for (OPT's mlp_out,
    ModernBERT's attn_out), naming the ones they have."""
    available = tap_paths(model_type)
    for tap in taps:
        if tap not in available:
            has = f"it has {', '.join(available)}" if available else _families_with_taps()
            raise OptionError(f"tap {tap!r} is not available for model type {model_type!r}; {has}")


def tap_module(layer: nn.Module, model_type: str, tap: str) -> nn.Module:
    """The sub-module of one encoder layer whose output is ``tap``."""
    if tap not in TAPS:
        raise OptionError(f"unknown tap {tap!r}; choose from {', '.join(TAPS)}")
    available = tap_paths(model_type)
    path = available.get(tap)
    if path is None:
        has = f"it has {', '.join(available)}" if available else _families_with_taps()
        raise OptionError(f"tap {tap!r} is not available for model type {model_type!r}; {has}")
    module: nn.Module = layer
    for part in path.split("."):
        if not hasattr(module, part):
            raise OptionError(
                f"tap {tap!r} is not available for model type {model_type!r}: its layers have no "
                f"'{path}' sub-module; {_families_with_taps()}"
            )
        module = getattr(module, part)
    return module


def module_output(output: object, index: int = 0) -> torch.Tensor:
    """What a forward hook reads of a module's ``output``: the tensor, or item ``index`` of its tuple
    (attention modules return ``(context, probs)``)."""
    if isinstance(output, tuple | list):
        return output[index]
    if index != 0:
        raise RuntimeError("expected a tuple output with attention probabilities; is eager attention on?")
    return output  # type: ignore[return-value]


class HookRecorder:
    """Records hidden states (layer inputs/outputs) and sub-layer taps with forward hooks.

    ``hidden[i]`` is hidden state ``i``: index 0 is the input of the first layer (the embedding
    output, after ELECTRA's projection where it has one), ``i`` the output of layer ``i``."""

    def __init__(
        self,
        layers: Sequence[nn.Module],
        *,
        hidden: bool,
        tap_layers: Sequence[int] = (),
        taps: Sequence[str] = (),
        model_type: str = "bert",
    ) -> None:
        self.hidden: dict[int, torch.Tensor] = {}
        self.taps: dict[str, dict[int, torch.Tensor]] = {t: {} for t in taps}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        if hidden:
            self._handles.append(layers[0].register_forward_pre_hook(self._record_input, with_kwargs=True))
            for i, layer in enumerate(layers, start=1):
                self._handles.append(layer.register_forward_hook(self._record_output(i)))
        for tap in taps:
            for i in tap_layers:
                module = tap_module(layers[i - 1], model_type, tap)
                self._handles.append(module.register_forward_hook(self._record_tap(tap, i)))

    def _record_input(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.hidden[0] = args[0] if args else kwargs["hidden_states"]

    def _record_output(self, i: int):
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            self.hidden[i] = module_output(output)

        return hook

    def _record_tap(self, tap: str, i: int):
        index = _TAP_INDEX[tap]

        def hook(module: nn.Module, args: tuple, output: object) -> None:
            self.taps[tap][i] = module_output(output, index)

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> HookRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
