"""Sentence, word and fused features as functions over an extraction stream.

The Encoder runs the forward pass and hands its outputs here (``Encoder.iter_results``: the plan
applied; ``features``: the raw stream, pooled once per mode); nothing in this module calls back into
the Encoder or imports torch. ``Encoder.embed``, ``embed_words`` and ``features`` are thin: plan,
stream, one of these functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from .._results import LayerStack, SentenceVector, WordVectors, check_float16, layers_along
from ..errors import OptionError, check_choice
from .fuse import check_fusion, fuse_layers, fusion_layers
from .layers import LayerSpec, resolve_layers
from .names import SENTENCE_POOLS, SPECIAL_TOKENS
from .plan import OutputPlan
from .pool import pool_sentence

Stream = Iterable[tuple[int, LayerStack]]
Outputs = Iterable[tuple[int, LayerStack, LayerStack | WordVectors | SentenceVector]]


def sentence_matrix(
    outputs: Outputs, n_texts: int, plan: OutputPlan, *, n_hidden_states: int, hidden_size: int
) -> np.ndarray:
    """``(n_texts, n_layers, hidden)``, or ``(n_texts, dim)`` fused: one row per input, in input
    order, from ``Encoder.iter_results``' ``(index, stack, result)``."""
    out = np.empty((n_texts, *plan.row_shape(hidden_size, n_hidden_states)), dtype=plan.dtype)
    for index, stack, result in outputs:
        assert isinstance(result, SentenceVector)
        if plan.dtype == "float16":  # a value past its range would become inf
            check_float16(result.vector, f"input {index}", layers_along(stack, plan.fuse))
        out[index] = result.vector
    return out


def word_vectors(outputs: Outputs, n_inputs: int, dtype: str = "float32") -> list[WordVectors]:
    """One WordVectors per input, in input order, from ``Encoder.iter_results``; ``vectors`` in
    ``dtype`` (computed in float32, cast once; float16 refuses a value past its range)."""
    results: dict[int, WordVectors] = {}
    for index, stack, result in outputs:
        assert isinstance(result, WordVectors)
        if dtype == "float16":
            check_float16(result.vectors, f"input {index}", layers_along(stack, result.fuse))
            result = WordVectors(**{**result.__dict__, "vectors": result.vectors.astype(np.float16)})
        results[index] = result
    return [results[i] for i in range(n_inputs)]


def features_layers(
    fuses: Sequence[str],
    layers: LayerSpec | None,
    pools: Sequence[str],
    special_tokens: str,
    n_hidden_states: int,
) -> tuple[int, ...]:
    """Check the options of ``Encoder.features`` and return the hidden states all fusions need."""
    if not pools or not fuses:
        raise OptionError(
            "features() needs at least one pool and one fusion, e.g. pools=['mean'], fuses=['last']"
        )
    for pool in pools:
        check_choice("pools item", pool, SENTENCE_POOLS)
    for fuse in fuses:
        check_fusion(fuse)
    check_choice("special_tokens", special_tokens, SPECIAL_TOKENS)
    if layers is not None and all(fusion_layers(f, n_hidden_states) is not None for f in fuses):
        raise OptionError(
            "layers= only applies to the generic fusions (mean, sum, concat); none was asked for"
        )
    needed: set[int] = set()
    for fuse in fuses:
        named = fusion_layers(fuse, n_hidden_states)
        generic = resolve_layers("all" if layers is None else layers, n_hidden_states)
        needed.update(named if named is not None else generic)
    return tuple(sorted(needed))


def all_features(
    stream: Stream,
    n_texts: int,
    *,
    pools: Sequence[str],
    fuses: Sequence[str],
    layers: LayerSpec | None,
    extracted: tuple[int, ...],
    special_tokens: str,
    n_hidden_states: int,
    hidden_size: int,
) -> dict[tuple[str, str], np.ndarray]:
    """Every (pool, fusion) combination from one stream, pooling each stack once per pool."""
    pooled = {p: np.empty((n_texts, len(extracted), hidden_size), dtype=np.float32) for p in pools}
    for index, stack in stream:
        for pool in pools:
            pooled[pool][index] = pool_sentence(stack, pool, special_tokens)  # type: ignore[arg-type]
    generic = resolve_layers("all" if layers is None else layers, n_hidden_states)
    out: dict[tuple[str, str], np.ndarray] = {}
    for pool in pools:
        for fuse in fuses:
            if fusion_layers(fuse, n_hidden_states) is None:  # generic fusions see only the layers asked for
                picked = pooled[pool][:, [extracted.index(i) for i in generic]]
                out[(pool, fuse)] = fuse_layers(
                    picked, generic, fuse, n_hidden_states=n_hidden_states, axis=1
                )
            else:
                out[(pool, fuse)] = fuse_layers(
                    pooled[pool], extracted, fuse, n_hidden_states=n_hidden_states, axis=1
                )
    return out
