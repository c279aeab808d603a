"""What sets decoder language models apart: their final norm, found and checked at load.

A decoder LM (Llama, Gemma, GPT-2, Pythia, OPT, Phi, OLMo, or any causal LM: families.py says which
configs are decoders) has the same layout of hidden states as an encoder: index 0 is the embedding
output (for Gemma already scaled by √hidden, as the first layer sees it), index ``i`` the output of
layer ``i``. Two things differ:

- **The final norm.** A decoder applies one more norm (``norm``, ``ln_f``, ``final_layer_norm``…)
  after its last layer (:func:`settle_final_norm` checks at load which module reproduces
  transformers' last hidden state), and its ``lm_head`` reads the normed state. transformers returns
  hidden state L *after* that norm (its ``output_hidden_states`` overwrites the last one with
  ``last_hidden_state``) and every other index before any norm. layerwise follows it by default
  (``final_norm=True``); ``final_norm=False`` gives hidden state L as the raw residual stream, like
  1 … L-1; ``final_norm="all"`` passes every hidden state through the final norm, as the logit lens
  reads them, so that layers compare on one scale (the raw residual stream of a large decoder holds
  a few "massive activations" that dominate cosines). It is a setting of each call
  (OutputPlan.final_norm; the Encoder's is the default): every forward computes the raw residual
  stream and :func:`apply_final_norm` applies the call's setting after it, so one forward serves
  any. When the forward stops early (``layers=[3]`` of 30), the deepest layer run is never normed by
  the model: it is the same number as in a full run.
- **No segments, causal attention.** Pairs are refused (join the texts with a separator you choose),
  attention sees only earlier tokens, and with right padding (the only padding layerwise uses) the
  position ids of real tokens are 0 … n-1 as in an unpadded run. In a causal model only the last
  token has seen the whole input: ``pool="last"`` takes it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from ..errors import OptionError
from .families import is_decoder_config

# where decoders keep their final norm (Llama's ``norm``, GPT-2's ``ln_f``, GPT-NeoX's and OPT's
# ``final_layer_norm``, Phi's ``final_layernorm``, ModernBERT's ``final_norm``): a candidate, which
# :func:`settle_final_norm` checks against transformers' own last hidden state at load
_FINAL_NORM_PATHS = (
    "norm",
    "ln_f",
    "final_layer_norm",
    "final_layernorm",
    "norm_f",
    "final_norm",
    "decoder.final_layer_norm",
)
# settle_final_norm's verdict, kept on the model: the module, "none" (the last state is not normed),
# or "unknown" (transformers normalises it with something else: only its own last state is given)
_SETTLED = "_layerwise_final_norm"


@contextmanager
def raw_hidden_states(model: Any) -> Iterator[None]:
    """Within the block, the model's ``output_hidden_states`` are all the raw residual stream.

    transformers reads ``config.tie_last_hidden_states`` at every call (utils/output_capturing.py):
    when true (its default for language models) the last hidden state returned is replaced by the
    normed ``last_hidden_state`` (with the encoder cut early, an intermediate layer's). The tie is off
    here: :func:`apply_final_norm` applies the call's final norm afterwards. The caller holds the
    model alone (Hugging Face forwards run under the exclusive lock)."""
    config = model.config
    if not is_decoder_config(config) or getattr(model, _SETTLED, None) == "unknown":
        yield
        return
    missing = object()
    before = getattr(config, "tie_last_hidden_states", missing)
    config.tie_last_hidden_states = False
    try:
        yield
    finally:
        if before is missing:
            del config.tie_last_hidden_states
        else:
            config.tie_last_hidden_states = before


def final_norm_module(model: Any) -> Any:
    """A decoder's final norm: the module its ``lm_head`` reads after (see ``_FINAL_NORM_PATHS``), or
    None (none, or none known: :func:`settle_final_norm`)."""
    settled = getattr(model, _SETTLED, None)
    if settled is not None:
        return settled if isinstance(settled, torch.nn.Module) else None
    for path in _FINAL_NORM_PATHS:
        module: Any = model
        for part in path.split("."):
            module = getattr(module, part, None)
        if isinstance(module, torch.nn.Module):
            return module
    return None


def settle_final_norm(model: Any, raw_last: torch.Tensor, returned_last: torch.Tensor) -> None:
    """Which final norm a decoder applies, from one forward: its last layer's raw output and the
    last hidden state transformers returned. The candidate module reproduces it (the norm the
    logit lens and ``final_norm`` use), or the two are equal (no final norm), or neither: then
    only transformers' own last state is given (``final_norm=True``)."""
    norm = final_norm_module(model)
    close = functools.partial(_close, returned_last)
    with torch.inference_mode():
        normed = None if norm is None else norm(raw_last.to(_device_of(norm, raw_last))).to(raw_last.device)
    if normed is not None and close(normed):
        verdict: Any = norm
    else:
        verdict = "none" if close(raw_last) else "unknown"
    # in __dict__, not setattr: nn.Module would register the norm as a second child (its state dict)
    model.__dict__[_SETTLED] = verdict


def final_norm_known(model: Any) -> bool:
    """Whether ``final_norm`` False and "all" can be given for ``model`` (see settle_final_norm)."""
    return getattr(model, _SETTLED, None) != "unknown"


def _device_of(module: torch.nn.Module, fallback: torch.Tensor) -> torch.device:
    parameter = next(module.parameters(), None)
    return fallback.device if parameter is None or parameter.is_meta else parameter.device


def _close(expected: torch.Tensor, got: torch.Tensor) -> bool:
    expected, got = expected.float(), got.float()
    scale = float(expected.abs().max()) or 1.0
    return bool(torch.allclose(got, expected, rtol=1e-3, atol=1e-3 * scale))


def apply_final_norm(model: Any, hidden: Any, layers: Sequence[int], final_norm: bool | str) -> Any:
    """A decoder's raw hidden states ``(L, ..., H)`` of ``layers`` as a call asks for them: the
    final norm on hidden state n_layers (True, what transformers returns), on none (False) or on
    every one ("all", as the logit lens reads them). An encoder's come back as they are."""
    config = model.config
    if not is_decoder_config(config):
        return hidden
    settled = getattr(model, _SETTLED, None)
    if settled == "unknown":
        if final_norm is True:
            return hidden  # transformers' own last state, kept by the forward
        raise OptionError(
            f"final_norm={final_norm!r}: this {config.model_type!r} model normalises its last hidden state "
            "with a module layerwise does not know, so only transformers' own hidden states are given; "
            "use final_norm=True (the default)"
        )
    if final_norm is False or settled == "none":
        return hidden
    norm = final_norm_module(model)
    if final_norm == "all":
        return norm(hidden).to(hidden.device)  # a placed model's norm may sit on another device
    last = int(config.num_hidden_layers)
    if last in layers:
        k = list(layers).index(last)
        hidden[k] = norm(hidden[k]).to(hidden.device)  # a fresh stack of the forward's: changed in place
    return hidden
