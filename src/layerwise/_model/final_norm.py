"""A model's final norm, found and checked at load, and applied as each call asks.

Index 0 of the hidden states is the embedding output (for Gemma already scaled by √hidden, as the
first layer sees it), index ``i`` the output of layer ``i``. Many models apply one more norm after
their last layer: every pre-norm decoder LM (Llama's ``norm``, GPT-2's ``ln_f``, GPT-NeoX's and OPT's
``final_layer_norm``, Phi's ``final_layernorm``), and some encoders (T5's ``final_layer_norm``,
ModernBERT's ``final_norm``, mBART's ``layer_norm``). transformers returns hidden state L *after* that
norm (its ``output_hidden_states`` overwrites the last one with ``last_hidden_state``) and every other
index before any norm. layerwise follows it by default (``final_norm=True``); ``final_norm=False``
gives hidden state L as the raw residual stream, like 1 … L-1; ``final_norm="all"`` passes every
hidden state through the final norm, as the logit lens reads them, so that layers compare on one scale
(the raw residual stream of a large decoder holds a few "massive activations" that dominate cosines).

It is a setting of each call (OutputPlan.final_norm; the Encoder's is the default): every forward
computes the raw residual stream and :func:`apply_final_norm` applies the call's setting after it,
so one forward serves any. When the forward stops early (``layers=[3]`` of 30), the deepest layer run
is never normed by the model: it is the same number as in a full run.

Which module is the final norm is settled at load (:func:`settle_final_norm`): the candidate found by
name must reproduce transformers' own last hidden state. Three verdicts:

- a module: ``final_norm`` True, False and "all" are all honoured;
- none (BERT and most encoders, BART): the last state is the last layer's output; ``False`` says
  the same as ``True``, and "all" is refused (there is no norm to pass the states through);
- unknown (transformers norms the last state with something layerwise cannot separate): only
  transformers' own states are given, and False or "all" is refused naming the model.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import torch

from ..errors import OptionError
from .families.kinds import BERT_LAYOUT, is_decoder_config
from .families.table import family
from .notes import note, noted

# where models keep their final norm (see the docstring): a candidate, which settle_final_norm checks
# against transformers' own last hidden state at load
_FINAL_NORM_PATHS = (
    "norm",
    "ln_f",
    "final_layer_norm",
    "final_layernorm",
    "norm_f",
    "final_norm",
    "layer_norm",
    "decoder.final_layer_norm",
    "decoder.layer_norm",
)
# settle_final_norm's verdict, noted beside the model (notes.py): the module, "none" (the last state
# is not normed), or "unknown" (transformers normalises it with something else: only its own last
# state is given)
_SETTLED = "final_norm"
Verdict = Literal["module", "none", "unknown"]


def final_norm_module(model: Any) -> Any:
    """A model's final norm: the module settled at load, else the one found by name (see
    ``_FINAL_NORM_PATHS``), or None (none, or none known: :func:`settle_final_norm`)."""
    settled = noted(model, _SETTLED)
    if settled is not None:
        return settled if isinstance(settled, torch.nn.Module) else None
    row = family(getattr(getattr(model, "config", None), "model_type", None))
    if row is not None and row.final_norm is None:
        return None  # post-norm layers (BERT): the last layer's output is the last state
    named = (row.final_norm,) if row is not None and row.final_norm != "found at load" else ()
    for path in (*named, *_FINAL_NORM_PATHS):
        module: Any = model
        for part in path.split("."):
            module = getattr(module, part, None)
        if isinstance(module, torch.nn.Module):
            return module
    return None


def verdict(model: Any) -> Verdict:
    """What is known of ``model``'s final norm: a module, none, or one layerwise cannot separate."""
    settled = noted(model, _SETTLED)
    if settled == "unknown":
        return "unknown"
    return "module" if final_norm_module(model) is not None else "none"


@functools.cache
def _config_norm(config_class: Any, fields: str) -> bool:
    import json

    from transformers import AutoModel

    config = config_class.from_dict(json.loads(fields))
    with torch.device("meta"):
        skeleton = AutoModel.from_config(config)
    if getattr(config, "is_encoder_decoder", False):
        skeleton = skeleton.get_encoder()
    return final_norm_module(skeleton) is not None


def config_has_final_norm(config: Any) -> bool:
    """Whether the model ``config`` describes has a final norm (a verdict of "module"), before its
    weights are read (a skeleton on the meta device): the Ray driver and ``info -m`` settle plans
    with it. A decoder is taken to have one (its load checks it)."""
    if is_decoder_config(config):
        return True
    if config.model_type in BERT_LAYOUT or getattr(config, "auto_map", None):
        return False
    config_class: Any = type(config)
    return _config_norm(config_class, config.to_json_string())


@contextmanager
def raw_hidden_states(model: Any) -> Iterator[None]:
    """Within the block, the model's ``output_hidden_states`` are all the raw residual stream.

    transformers reads ``config.tie_last_hidden_states`` at every call (utils/output_capturing.py):
    when true (its default) the last hidden state returned is replaced by the normed
    ``last_hidden_state`` (with the encoder cut early, an intermediate layer's). The tie is off
    here: :func:`apply_final_norm` applies the call's final norm afterwards. The caller holds the
    model alone (Hugging Face forwards run under the exclusive lock)."""
    if verdict(model) == "unknown":
        yield
        return
    with _untied(model.config):
        yield


@contextmanager
def _untied(config: Any) -> Iterator[None]:
    """``config.tie_last_hidden_states`` off inside the block, as it was after."""
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


def settle_final_norm(model: Any, raw_last: torch.Tensor, returned_last: torch.Tensor) -> None:
    """Which final norm a model applies, from one forward: its last layer's raw output and the
    last hidden state transformers returned. The candidate module reproduces it (the norm the
    logit lens and ``final_norm`` use), or the two are equal (no final norm), or neither: then
    only transformers' own last state is given (``final_norm=True``)."""
    norm = final_norm_module(model)
    close = functools.partial(_close, returned_last)
    with torch.inference_mode():
        normed = None if norm is None else norm(raw_last.to(_device_of(norm, raw_last))).to(raw_last.device)
    if normed is not None and close(normed):
        settled: Any = norm
    else:
        settled = "none" if close(raw_last) else "unknown"
    note(model, _SETTLED, settled)


def settle_from_tie(model: Any, given: torch.Tensor, returned_last: torch.Tensor, extra: dict) -> None:
    """:func:`settle_final_norm` for a model whose layer outputs are not its hidden states (ALBERT,
    XLM: padded.py reads transformers' own states): its raw last state is the one transformers gives
    with the tie off. Where the tie changes nothing and a norm is found by name, the model may norm
    its last state in a loop of its own: unknown, and only its own states are given."""
    with _untied(model.config):
        raw_last = model(input_ids=given, output_hidden_states=True, **extra).hidden_states[-1]
    if _close(returned_last, raw_last) and final_norm_module(model) is not None:
        note(model, _SETTLED, "unknown")
    else:
        settle_final_norm(model, raw_last, returned_last)


def final_norm_known(model: Any) -> bool:
    """Whether the raw last state can be given for ``model`` (see settle_final_norm)."""
    return verdict(model) != "unknown"


def _device_of(module: torch.nn.Module, fallback: torch.Tensor) -> torch.device:
    parameter = next(module.parameters(), None)
    return fallback.device if parameter is None or parameter.is_meta else parameter.device


def _close(expected: torch.Tensor, got: torch.Tensor) -> bool:
    expected, got = expected.float(), got.float()
    if not (expected.isfinite().all() and got.isfinite().all()):  # NaN weights: a run reports them
        return bool(
            torch.equal(expected.isnan(), got.isnan()) and torch.allclose(got, expected, equal_nan=True)
        )
    scale = float(expected.abs().max()) or 1.0
    return bool(torch.allclose(got, expected, rtol=1e-3, atol=1e-3 * scale))


def check_final_norm_honoured(model: Any, final_norm: bool | str, name: str) -> None:
    """Refuse, naming the model and why, a ``final_norm`` that ``model`` cannot honour."""
    known = verdict(model)
    model_type = getattr(model.config, "model_type", "?")
    if known == "unknown" and final_norm is not True:
        raise OptionError(
            f"final_norm={final_norm!r}: this {model_type!r} model ({name}) normalises its last hidden state "
            "with a module layerwise cannot separate, so only transformers' own hidden states are given; "
            "use final_norm=True (the default)"
        )
    if known == "none" and final_norm == "all":  # as _features/plan.py's check_final_norm_for says it
        raise OptionError(
            f"final_norm='all' passes every hidden state through the model's final norm; {name} has "
            "none (its last hidden state is its last layer's output): leave final_norm out"
        )


def apply_final_norm(model: Any, hidden: Any, layers: Sequence[int], final_norm: bool | str | None) -> Any:
    """A model's raw hidden states ``(L, ..., H)`` of ``layers`` as a call asks for them: the final
    norm on hidden state n_layers (True, what transformers returns), on none (False) or on every one
    ("all", as the logit lens reads them). A model without a final norm gives them as they are;
    None (a plan settled for a model without one) is True."""
    known = verdict(model)
    if known != "module":
        if final_norm in (True, None) or (known == "none" and final_norm is False):
            return hidden  # the raw states; or transformers' own last state, kept by the forward
        check_final_norm_honoured(model, final_norm, "this model")
    if final_norm is False:
        return hidden
    norm = final_norm_module(model)
    if final_norm == "all":
        return norm(hidden).to(hidden.device)  # a placed model's norm may sit on another device
    last = int(model.config.num_hidden_layers)
    if last in layers:
        k = list(layers).index(last)
        hidden[k] = norm(hidden[k]).to(hidden.device)  # a fresh stack of the forward's: changed in place
    return hidden
