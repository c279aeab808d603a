"""Pooling: from per-token hidden states to sentence and word vectors, at every layer.

Sentence pooling over the real tokens of one input (padding never reaches a LayerStack):

    cls     the [CLS] vector (first token)
    mean    the mean over tokens
    max     the element-wise maximum over tokens
    last    the last token's vector: the decoder convention (in a causal model only the last token
            has seen the whole input). A LayerStack holds real tokens only, so under padding this is
            still the input's own last token.

``special_tokens="include"`` (the default) pools over [CLS] and [SEP] too. That is what
sentence-transformers does (its mean pooling averages every token the attention mask covers), and
sentence-embedding models such as all-MiniLM-L6-v2 were trained that way, so it reproduces their
published scores. ``"exclude"`` pools over content tokens only; an input with no content tokens
(an empty text) then falls back to its special tokens rather than to an undefined mean.

Word pooling groups wordpieces by word (``word_ids`` within each segment) and combines them
(flair's semantics):

    first       the first wordpiece (the BERT paper's choice for NER)
    last        the last wordpiece
    mean        the mean of the wordpieces
    first_last  first and last concatenated (2 x hidden)
    max         the element-wise maximum
"""

from __future__ import annotations

import numpy as np

from .._results import LayerStack, WordVectors
from ..errors import check_choice
from .names import SENTENCE_POOLS, SPECIAL_TOKENS, SUBWORD_POOLS, SentencePool, SpecialTokens, SubwordPool


def pool_sentence(
    stack: LayerStack, pool: SentencePool = "mean", special_tokens: SpecialTokens = "include"
) -> np.ndarray:
    """One vector per layer for the whole input: ``(n_layers, hidden)``."""
    check_choice("pool", pool, SENTENCE_POOLS)
    check_choice("special_tokens", special_tokens, SPECIAL_TOKENS)
    hidden = stack.hidden
    if pool == "cls":
        return hidden[:, 0].copy()
    if special_tokens == "exclude" and (stack.word_ids >= 0).any():
        hidden = hidden[:, stack.word_ids >= 0]
    if pool == "last":  # with "exclude", the last content token (not a trailing [SEP] or EOS)
        return hidden[:, -1].copy()
    if pool == "mean":
        return hidden.mean(axis=1, dtype=np.float64).astype(np.float32)
    return hidden.max(axis=1)


def word_groups(stack: LayerStack) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Word number of each token (-1 for special tokens) and the (segment, word id) of each word,
    in order of first appearance."""
    return word_group_keys(stack.segment_ids, stack.word_ids)


def word_group_keys(segments: np.ndarray, word_ids: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """:func:`word_groups` from a token's segment and word id arrays (-1: a special token)."""
    keys: dict[tuple[int, int], int] = {}
    group = np.full(len(word_ids), -1, dtype=np.int64)
    for t, (segment, word) in enumerate(zip(segments.tolist(), word_ids.tolist(), strict=True)):
        if word < 0:
            continue
        group[t] = keys.setdefault((segment, word), len(keys))
    return group, list(keys)


def pool_words(
    stack: LayerStack, subword: SubwordPool = "first", vectors: np.ndarray | None = None
) -> WordVectors:
    """Word vectors at every layer of ``stack``. ``vectors``: the words' vectors pooled already, where
    the states were (device_pool.py); the stack then gives the words, spans and counts."""
    check_choice("subword", subword, SUBWORD_POOLS)
    group, keys = word_groups(stack)
    n_words = len(keys)
    tokens = np.flatnonzero(group >= 0)
    owner = group[tokens]
    counts = np.bincount(owner, minlength=n_words)
    # tokens are in order, so the first/last token of each word is where its group starts/ends
    first = np.full(n_words, -1, dtype=np.int64)
    last = np.full(n_words, -1, dtype=np.int64)
    first[owner[::-1]] = tokens[::-1]
    last[owner] = tokens
    if vectors is None:
        vectors = _subword_vectors(stack.hidden, subword, tokens, owner, counts, first, last)
    spans = np.zeros((n_words, 2), dtype=np.int32)
    if n_words:
        spans[:, 0] = stack.offsets[first, 0]
        spans[:, 1] = stack.offsets[last, 1]
    words = []
    for (segment, word_id), (start, end) in zip(keys, spans.tolist(), strict=True):
        if stack.words is not None and segment == 0:
            words.append(stack.words[word_id])
        else:
            words.append(stack.segment_text(segment)[start:end])
    segments = np.asarray([k[0] for k in keys], dtype=np.int8)
    if stack.words_empty and stack.words is not None:
        vectors, spans, words, segments, counts = _keep_empty_words(
            stack, keys, vectors, spans, words, counts
        )
    return WordVectors(
        vectors=np.ascontiguousarray(vectors),
        layers=stack.layers,
        words=tuple(words),
        spans=spans,
        segment_ids=segments,
        n_subwords=counts.astype(np.int32),
        text=stack.text,
        text_pair=stack.text_pair,
        words_lost=stack.words_lost,
        words_empty=stack.words_empty,
    )


def _subword_vectors(
    hidden: np.ndarray,
    subword: str,
    tokens: np.ndarray,
    owner: np.ndarray,
    counts: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
) -> np.ndarray:
    """``(L, words, H)``: each word's wordpieces (``tokens``, of word ``owner``) pooled."""
    n_words = len(counts)
    if subword == "first":
        return hidden[:, first]
    if subword == "last":
        return hidden[:, last]
    if subword == "first_last":
        return np.concatenate([hidden[:, first], hidden[:, last]], axis=-1)
    if subword == "mean":
        sums = np.zeros((hidden.shape[0], n_words, hidden.shape[2]), dtype=np.float64)
        np.add.at(sums, (slice(None), owner), hidden[:, tokens])  # type: ignore[arg-type]
        return (sums / np.maximum(counts, 1)[None, :, None]).astype(np.float32)
    vectors = np.full((hidden.shape[0], n_words, hidden.shape[2]), -np.inf, dtype=np.float32)
    np.maximum.at(vectors, (slice(None), owner), hidden[:, tokens])  # type: ignore[arg-type]
    return vectors


def _keep_empty_words(stack: LayerStack, keys, vectors, spans, words, counts) -> tuple:
    """Pre-split words that produced no token (a zero-width space, a soft hyphen) keep their
    slot with a zero vector (flair's choice) and ``n_subwords`` 0, so vector j is word j."""
    assert stack.words is not None
    starts, position = [], 0
    for word in stack.words:
        starts.append(position)
        position += len(word) + 1
    ids = sorted({k[1] for k in keys} | set(stack.words_empty))
    slot = {word_id: j for j, word_id in enumerate(ids)}
    present = [slot[k[1]] for k in keys]
    full = np.zeros((vectors.shape[0], len(ids), vectors.shape[2]), dtype=vectors.dtype)
    full[:, present] = vectors
    full_spans = np.asarray([(starts[w], starts[w] + len(stack.words[w])) for w in ids], dtype=np.int32)
    full_spans.reshape(-1, 2)[present] = spans
    full_counts = np.zeros(len(ids), dtype=np.int64)
    full_counts[present] = counts
    return (
        full,
        full_spans.reshape(-1, 2),
        [stack.words[w] for w in ids],
        np.zeros(len(ids), np.int8),
        full_counts,
    )
