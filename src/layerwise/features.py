"""Sentence, word and fused features from one forward pass (the engine behind
``Encoder.embed``, ``Encoder.embed_words`` and ``Encoder.features``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

from .errors import InputError, OptionError, check_choice
from .fuse import check_fusion, fuse_layers, fusion_layers
from .layers import LayerSpec, resolve_layers
from .pool import (
    SENTENCE_POOLS,
    SPECIAL_TOKENS,
    SUBWORD_POOLS,
    SentencePool,
    SpecialTokens,
    SubwordPool,
    WordVectors,
    pool_sentence,
    pool_words,
)
from .results import LayerStack, SentenceVector

if TYPE_CHECKING:
    from .encoder import Encoder


def plan_layers(layers: LayerSpec | None, fusion: str | None, n_hidden_states: int) -> tuple[int, ...]:
    """Hidden states to extract for ``layers`` and ``fusion``: a named fusion picks its own."""
    if fusion is None:
        return resolve_layers("all" if layers is None else layers, n_hidden_states)
    named = fusion_layers(fusion, n_hidden_states)
    if named is None:
        return resolve_layers("all" if layers is None else layers, n_hidden_states)
    if layers is not None:
        raise OptionError(
            f"fuse={fusion!r} uses hidden states {named} by itself; drop layers=, or fuse the layers you "
            "choose with a generic fusion: fuse='mean', 'sum' or 'concat'"
        )
    return named


def sentence_features(
    encoder: Encoder,
    stacks: Iterable[tuple[int, object]],
    n_texts: int,
    layers: tuple[int, ...],
    combos: Sequence[tuple[str, str | None]],
    special_tokens: SpecialTokens,
) -> dict[tuple[str, str | None], np.ndarray]:
    """Fill one array per (pool, fusion) from streamed LayerStacks, pooling each stack once per pool."""
    out: dict[tuple[str, str | None], np.ndarray] = {}
    pools = sorted({p for p, _ in combos}, key=[p for p, _ in combos].index)
    for index, stack in stacks:
        pooled = {p: pool_sentence(stack, p, special_tokens) for p in pools}  # (L, H) each
        for pool, fusion in combos:
            vector = pooled[pool] if fusion is None else _fuse(pooled[pool], layers, fusion, encoder)
            if (pool, fusion) not in out:
                out[(pool, fusion)] = np.empty((n_texts, *vector.shape), dtype=np.float32)
            out[(pool, fusion)][index] = vector
    for pool, fusion in combos:
        if (pool, fusion) not in out:  # no inputs at all
            width = encoder.hidden_size * (4 if fusion == "concat_last4" else 1)
            shape = (0, len(layers), encoder.hidden_size) if fusion is None else (0, width)
            out[(pool, fusion)] = np.empty(shape, dtype=np.float32)
    return out


def _fuse(
    array: np.ndarray, layers: tuple[int, ...], fusion: str, encoder: Encoder, axis: int = 0
) -> np.ndarray:
    return fuse_layers(array, layers, fusion, n_hidden_states=encoder.n_hidden_states, axis=axis)


def embed(
    encoder: Encoder,
    texts: str | Sequence[str] | None,
    *,
    text_pairs: Sequence[str] | None,
    pairs: Sequence[tuple[str, str]] | None,
    layers: LayerSpec | None,
    pool: SentencePool,
    fusion: str | None,
    special_tokens: SpecialTokens,
    **extract_options: object,
) -> np.ndarray:
    check_choice("pool", pool, SENTENCE_POOLS)
    check_choice("special_tokens", special_tokens, SPECIAL_TOKENS)
    if fusion is not None:
        check_fusion(fusion)
    single = isinstance(texts, str)
    if single:
        texts = [texts]  # type: ignore[list-item]
    layer_ids = plan_layers(layers, fusion, encoder.n_hidden_states)
    stream = encoder.iter_extract(
        texts, text_pairs=text_pairs, pairs=pairs, layers=layer_ids, **extract_options
    )
    n_texts = len(texts) if texts is not None else len(pairs or ())
    result = sentence_features(encoder, stream, n_texts, layer_ids, [(pool, fusion)], special_tokens)
    array = result[(pool, fusion)]
    return array[0] if single else array


def features(
    encoder: Encoder,
    texts: Sequence[str] | None,
    *,
    text_pairs: Sequence[str] | None,
    pairs: Sequence[tuple[str, str]] | None,
    pools: Sequence[SentencePool],
    fuses: Sequence[str],
    layers: LayerSpec | None,
    special_tokens: SpecialTokens,
    **extract_options: object,
) -> dict[tuple[str, str], np.ndarray]:
    if isinstance(texts, str):
        raise InputError("features() takes a list of texts; wrap a single text in a list")
    pools, fuses = list(pools), list(fuses)
    if not pools or not fuses:
        raise OptionError(
            "features() needs at least one pool and one fusion, e.g. pools=['mean'], fuses=['last']"
        )
    for p in pools:
        check_choice("pools item", p, SENTENCE_POOLS)
    for f in fuses:
        check_fusion(f)
    check_choice("special_tokens", special_tokens, SPECIAL_TOKENS)
    n = encoder.n_hidden_states
    needed: set[int] = set()
    for f in fuses:
        named = fusion_layers(f, n)
        needed.update(named if named is not None else resolve_layers("all" if layers is None else layers, n))
    layer_ids = tuple(sorted(needed))
    if layers is not None and all(fusion_layers(f, n) is not None for f in fuses):
        raise OptionError(
            "layers= only applies to the generic fusions (mean, sum, concat); none was asked for"
        )
    stream = encoder.iter_extract(
        texts, text_pairs=text_pairs, pairs=pairs, layers=layer_ids, **extract_options
    )
    n_texts = len(texts) if texts is not None else len(pairs or ())
    combos = [(p, f) for p in pools for f in fuses]
    generic = resolve_layers("all" if layers is None else layers, n)
    results = {}
    for (pool, _), array in sentence_features(
        encoder, stream, n_texts, layer_ids, [(p, None) for p in pools], special_tokens
    ).items():
        for f in fuses:
            if fusion_layers(f, n) is None:  # generic fusions see only the layers asked for
                picked = array[:, [layer_ids.index(i) for i in generic]]
                results[(pool, f)] = fuse_layers(picked, generic, f, n_hidden_states=n, axis=1)
            else:
                results[(pool, f)] = fuse_layers(array, layer_ids, f, n_hidden_states=n, axis=1)
    return {key: results[key] for key in combos}


def embed_words(
    encoder: Encoder,
    inputs: Sequence[str] | Sequence[Sequence[str]] | None,
    *,
    pairs: Sequence[tuple[str, str]] | None,
    subword: SubwordPool,
    layers: LayerSpec | None,
    fusion: str | None,
    **extract_options: object,
) -> list[WordVectors]:
    check_choice("subword", subword, SUBWORD_POOLS)
    if fusion is not None:
        check_fusion(fusion)
    if isinstance(inputs, str):
        raise InputError("embed_words() takes a list of texts or of word lists; wrap a single text in a list")
    texts = words = None
    if inputs is not None:
        kinds = {isinstance(item, str) for item in inputs}
        if len(kinds) > 1:
            raise InputError("embed_words() got a mix of texts and word lists; pass one kind per call")
        if kinds == {True}:
            texts = inputs
        else:
            words = inputs
    layer_ids = plan_layers(layers, fusion, encoder.n_hidden_states)
    stream = encoder.iter_extract(texts, pairs=pairs, words=words, layers=layer_ids, **extract_options)  # type: ignore[arg-type]
    results: dict[int, WordVectors] = {}
    for index, stack in stream:
        vectors = pool_words(stack, subword)
        if fusion is not None:
            fused = _fuse(vectors.vectors, layer_ids, fusion, encoder, axis=0)
            vectors = WordVectors(**{**vectors.__dict__, "vectors": fused})
        results[index] = vectors
    return [results[i] for i in range(len(results))]


PoolLevel = Literal["token", "word", "sentence"]


def parse_pool(spec: str) -> tuple[PoolLevel, str | None]:
    """``"token"``, ``"word:MODE"`` or ``"sentence:MODE"`` (the command line's --pool) → (level, mode)."""
    level, _, mode = spec.partition(":")
    if level == "token" and not mode:
        return "token", None
    choices = {"word": SUBWORD_POOLS, "sentence": SENTENCE_POOLS}
    if level in choices and mode in choices[level]:
        return level, mode  # type: ignore[return-value]
    listed = ["token"] + [f"{lv}:{m}" for lv, modes in choices.items() for m in modes]
    raise OptionError(f"pool {spec!r} is not valid; choose one of {', '.join(listed)}")


def iter_pooled(
    stream: Iterable[tuple[int, LayerStack]],
    *,
    level: PoolLevel,
    mode: str | None,
    fusion: str | None,
    layers: tuple[int, ...],
    n_hidden_states: int,
    special_tokens: SpecialTokens = "include",
) -> Iterator[tuple[int, LayerStack | WordVectors | SentenceVector]]:
    """Map streamed LayerStacks to what ``level`` asks for: the stack itself (token), its
    WordVectors (word) or its sentence vector; fused when ``fusion`` is given (word, sentence)."""
    if fusion is not None and level == "token":
        raise OptionError(
            "fuse applies to word and sentence pooling; for token vectors choose layers instead"
        )
    for index, stack in stream:
        if level == "token":
            yield index, stack
        elif level == "word":
            words = pool_words(stack, mode)  # type: ignore[arg-type]
            if fusion is not None:
                fused = fuse_layers(words.vectors, layers, fusion, n_hidden_states=n_hidden_states, axis=0)
                words = WordVectors(**{**words.__dict__, "vectors": fused})
            yield index, words
        else:
            vector = pool_sentence(stack, mode, special_tokens)  # type: ignore[arg-type]
            if fusion is not None:
                vector = fuse_layers(vector, layers, fusion, n_hidden_states=n_hidden_states, axis=0)
            yield index, SentenceVector(vector, stack.truncated)
