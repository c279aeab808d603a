"""Words: which words of an encoding have tokens, pre-split words' offsets in their joined text, and
whether ``embed_words`` was given texts or word lists."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InputError


def empty_words(encoding, words: Sequence[str], truncated: bool) -> tuple[int, ...]:
    """Words of a pre-split input that produced no token (those cut off by truncation aside)."""
    present = {w for w in encoding.word_ids if w is not None}
    limit = (max(present) + 1 if present else 0) if truncated else len(words)
    return tuple(j for j in range(limit) if j not in present)


def word_keys(encoding) -> set[tuple[int | None, int]]:
    """(segment, word) of every word that has at least one token."""
    return {(s, w) for s, w in zip(encoding.sequence_ids, encoding.word_ids, strict=True) if w is not None}


def word_offsets_to_text(
    offsets: Sequence[tuple[int, int]], word_ids: Sequence[int | None], words: Sequence[str]
) -> list[tuple[int, int]]:
    """Pre-split input gets offsets relative to each word; shift them into ``' '.join(words)``."""
    starts, position = [], 0
    for word in words:
        starts.append(position)
        position += len(word) + 1
    return [
        (0, 0) if w is None else (starts[w] + s, starts[w] + e)
        for (s, e), w in zip(offsets, word_ids, strict=True)
    ]


def split_word_inputs(
    inputs: Sequence[str] | Sequence[Sequence[str]] | None, words: Sequence[Sequence[str]] | None
) -> tuple[Sequence[str] | None, Sequence[Sequence[str]] | None]:
    """``embed_words``' first argument holds texts or word lists: ``(texts, words)``."""
    if isinstance(inputs, str):
        raise InputError("embed_words() takes a list of texts or of word lists; wrap a single text in a list")
    if inputs is None:
        return None, words
    kinds = {isinstance(item, str) for item in inputs}
    if len(kinds) > 1:
        raise InputError("embed_words() got a mix of texts and word lists; pass one kind per call")
    if kinds == {False}:
        if words is not None:
            raise InputError("pass word lists either as the first argument or as words=, not both")
        return None, inputs
    return inputs, words  # type: ignore[return-value]
