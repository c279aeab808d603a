"""What sets decoder language models apart: the families layerwise runs, and their final norm.

A decoder LM (Llama, Mistral, Qwen2/Qwen3, Gemma/Gemma2/Gemma3, GPT-2) has the same layout of hidden
states as an encoder: index 0 is the embedding output (for Gemma already scaled by √hidden, as the
first layer sees it), index ``i`` the output of layer ``i``. Two things differ:

- **The final norm.** A decoder applies one more norm (``norm``, ``ln_f``) after its last layer,
  and its ``lm_head`` reads the normed state. transformers returns hidden state L *after* that norm
  (its ``output_hidden_states`` overwrites the last one with ``last_hidden_state``) and every other
  index before any norm. layerwise follows it by default (``final_norm=True``);
  ``final_norm=False`` gives hidden state L as the raw residual stream, like 1 … L-1;
  ``final_norm="all"`` passes every hidden state through the final norm, as the logit lens reads
  them, so that layers compare on one scale (the raw residual stream of a large decoder holds a few
  "massive activations" that dominate cosines). It is a setting of each call (OutputPlan.final_norm;
  the Encoder's is the default): every forward computes the raw residual stream and
  :func:`apply_final_norm` applies the call's setting after it, so one forward serves any. When the
  forward stops early (``layers=[3]`` of 30), the deepest layer run is never normed by the model: it
  is the same number as in a full run.
- **No segments, causal attention.** Pairs are refused (join the texts with a separator you choose),
  attention sees only earlier tokens, and with right padding (the only padding layerwise uses) the
  position ids of real tokens are 0 … n-1 as in an unpadded run. In a causal model only the last
  token has seen the whole input: ``pool="last"`` takes it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

# transformers' model types of the decoder families layerwise is tested on
DECODER_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "gpt2")


def is_decoder_config(config: Any) -> bool:
    """Whether ``config`` is a decoder LM of a family layerwise runs."""
    return getattr(config, "model_type", None) in DECODER_MODEL_TYPES


@contextmanager
def raw_hidden_states(model: Any) -> Iterator[None]:
    """Within the block, the model's ``output_hidden_states`` are all the raw residual stream.

    transformers reads ``config.tie_last_hidden_states`` at every call (utils/output_capturing.py):
    when true (its default for language models) the last hidden state returned is replaced by the
    normed ``last_hidden_state`` (with the encoder cut early, an intermediate layer's). The tie is off
    here: :func:`apply_final_norm` applies the call's final norm afterwards. The caller holds the
    model alone (Hugging Face forwards run under the exclusive lock)."""
    config = model.config
    if not is_decoder_config(config):
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
    """A decoder's final norm (``norm``; GPT-2's ``ln_f``), or None."""
    return getattr(model, "norm", None) or getattr(model, "ln_f", None)


def apply_final_norm(model: Any, hidden: Any, layers: Sequence[int], final_norm: bool | str) -> Any:
    """A decoder's raw hidden states ``(L, ..., H)`` of ``layers`` as a call asks for them: the
    final norm on hidden state n_layers (True, what transformers returns), on none (False) or on
    every one ("all", as the logit lens reads them). An encoder's come back as they are."""
    config = model.config
    if final_norm is False or not is_decoder_config(config):
        return hidden
    norm = final_norm_module(model)
    if final_norm == "all":
        return norm(hidden).to(hidden.device)  # a placed model's norm may sit on another device
    last = int(config.num_hidden_layers)
    if last in layers:
        k = list(layers).index(last)
        hidden[k] = norm(hidden[k]).to(hidden.device)  # a fresh stack of the forward's: changed in place
    return hidden
