"""What an activation cache is made of, besides its model and corpus, and the checks on it that
need no corpus: they run before anything is written (writer.py, step 1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._settings.settings import FinalNorm
from ..errors import OptionError
from .format import hook_name

DTYPES = ("float16", "float32")
MAX_SHARD_BYTES = 2 * 2**30
SHARD_BYTES = 128 * 2**20  # a shard's activations: what one killed run can lose, and RAM while writing


@dataclass(frozen=True)
class CacheOptions:
    """What a cache is made of, besides its model and corpus (:func:`cache_activations`)."""

    layers: object = (-1,)
    context: int = 128
    tokens: int = 1_000_000
    dtype: str = "float16"
    shuffle_seed: int | None = 0
    final_norm: FinalNorm = False  # True or False: "all" is refused, naming the choices
    overwrite: bool = False
    shard_bytes: int = SHARD_BYTES
    hooks: tuple[str, ...] = ("resid",)


HOOKS = ("resid", "attn_out", "mlp_out")


def columns_of(hidden_states: tuple[int, ...], hooks: tuple[str, ...], n_layers: int, final_norm: bool):
    """The cache's columns and where each comes from: ``(names, [[kind, index], ...])``, index into
    the forward's hidden states (``resid``) or its taps (of the hidden states >= 1)."""
    if (
        isinstance(hooks, str)
        or not hooks
        or any(h not in HOOKS for h in hooks)
        or len(set(hooks)) < len(hooks)
    ):
        raise OptionError(f"hooks={hooks!r}: name one or more of {', '.join(HOOKS)}, each once")
    taps = [h for h in hooks if h != "resid"]
    if taps and 0 in hidden_states:
        raise OptionError(
            f"hooks {', '.join(taps)} belong to blocks; hidden state 0 (the embeddings) has none: ask for "
            "layers >= 1, or hooks=('resid',)"
        )
    names: list[str] = []
    sources: list[list] = []
    for j, i in enumerate(hidden_states):
        for hook in hooks:  # in the order asked for, layer by layer
            if hook == "resid":
                names.append(hook_name(i, n_layers, final_norm))
                sources.append(["resid", j])
            else:
                names.append(f"blocks.{i - 1}.hook_{hook}")
                sources.append([hook, sum(1 for k in hidden_states[:j] if k >= 1)])
    return names, sources


def check_numbers(encoder, context, tokens, dtype, shuffle_seed, final_norm, shard_bytes) -> None:
    def whole(name: str, value: object, least: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise OptionError(f"{name}={value!r} must be a whole number >= {least}")

    whole("context", context, 2)
    if context > encoder.max_length:
        raise OptionError(
            f"context={context} is longer than this model takes ({encoder.max_length} tokens): choose "
            f"--context {encoder.max_length} or less"
        )
    whole("tokens", tokens, 1)
    if tokens < context:
        raise OptionError(
            f"tokens={tokens} is less than one context of {context} tokens: ask for {context} or more"
        )
    if dtype not in DTYPES:
        raise OptionError(f"dtype={dtype!r} is not one the cache stores; choose {' or '.join(DTYPES)}")
    if shuffle_seed is not None:
        whole("shuffle_seed", shuffle_seed, 0)
    if final_norm is True and not encoder.models.takes_final_norm:
        raise OptionError(
            f"final_norm=True passes the last hidden state through the model's final norm; "
            f"{encoder.models.described} has none (its last hidden state is its last layer's output): "
            "leave --final-norm out"
        )
    if final_norm is False:
        encoder.models.check_final_norm(False)
    if final_norm not in (True, False):
        raise OptionError(
            f"final_norm={final_norm!r}: the cache takes True (the last hidden state through the final norm, "
            "named ln_final.hook_normalized) or False (the raw residual stream, TransformerLens' hooks)"
        )
    whole("shard_bytes", shard_bytes, 1)
    if shard_bytes > MAX_SHARD_BYTES:
        raise OptionError(
            f"shard_bytes={shard_bytes:,} is past its bound, {MAX_SHARD_BYTES:,} (2 GiB): a shard is held in "
            f"memory while it is written. Use {SHARD_BYTES:,} (the default) or less"
        )


def check_text_model(encoder: Any) -> None:
    """An image's or a clip's units are no token stream to pack: refused, naming what to use."""
    if encoder.modality != "text":
        raise OptionError(
            f"model {encoder.name!r} reads {encoder.modality}: the activation cache packs a text model's "
            "token stream into contexts (SAELens' format); extract its layers to a store instead "
            "(lw.extract_to_store, layerwise extract -o x.lw)"
        )
