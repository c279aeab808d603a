"""Tokenised inputs as arrays: one :class:`EncodedBlock` per call (or per block of a long call), and
one :class:`TokenColumns` per batch, with no Python loop over tokens on the way to the forward.

The fast tokenizer returns one Rust ``Encoding`` per input. The block keeps them and turns what the
forward and the pools read into NumPy columns, all inputs back to back, each column built on first
use (``np.fromiter`` over the encodings: C loops, no Python per token):

    lengths (B,)   starts (B+1,)   ids (N,)   type_ids (N,)   word_ids (N,), -1 for special tokens
    segments (N,): 0 = first text, 1 = second (BERT's token-type layout, from sequence ids)
    offsets (N, 2): character spans into the input's own text (pre-split words: into their join)

A batch's :class:`TokenColumns` are gathers of those columns. Per-input objects
(:class:`EncodedInput`: tuples of ids, tokens, offsets) are built only where something asks for one
(``block.item(i)``: windows, the server, ``Encoder.tokenize``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from typing import Any

import numpy as np

# a block of at least this many tokens builds the id -> string table (once per tokenizer, ~20 ms for
# 30,000 entries) instead of reading each encoding's tokens: a one-line command never pays for it
VOCABULARY_FROM = 4096


@dataclass(frozen=True, slots=True)
class EncodedInput:
    """One tokenised input. Offsets are character spans into ``text`` (or ``text_pair`` for tokens
    whose segment id is 1); special tokens get ``(0, 0)`` and word id ``None``."""

    index: int
    text: str
    text_pair: str | None
    words: tuple[str, ...] | None
    ids: tuple[int, ...]
    type_ids: tuple[int, ...]
    tokens: tuple[str, ...]
    offsets: tuple[tuple[int, int], ...]
    word_ids: tuple[int | None, ...]
    sequence_ids: tuple[int | None, ...]
    truncated: bool
    n_tokens_untruncated: int
    words_lost: int = 0
    # False when a very long input was tokenised only as far as truncation needs: then
    # n_tokens_untruncated and words_lost are lower bounds ("at least")
    counts_exact: bool = True
    words_empty: tuple[int, ...] = ()  # pre-split words with no token (they keep their slot downstream)

    def __len__(self) -> int:
        return len(self.ids)


def segment_ids(sequence_ids: Sequence[int | None]) -> np.ndarray:
    """Segment (0 = first text, 1 = second) of every token, from the tokenizer's sequence ids.

    Not from ``type_ids``: RoBERTa-style tokenizers give both segments type id 0. Special tokens
    belong to the segment of the content token before them ([CLS] to 0, the [SEP] after A to 0,
    the final [SEP] to 1), which is BERT's token-type layout."""
    return _fill_segments(
        np.asarray([-1 if s is None else s for s in sequence_ids], dtype=np.int8), np.zeros(1, dtype=np.int64)
    )


def _fill_segments(sequence: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Segments from sequence ids (-1 for special tokens) of inputs beginning at ``starts``: each
    special token takes the segment of the last content token before it in its input, else 0."""
    if not len(sequence):
        return np.zeros(0, dtype=np.int8)
    known = sequence >= 0
    known[starts] = True  # an input's first token opens segment 0 when it is special ([CLS])
    values = np.where(sequence >= 0, sequence, 0).astype(np.int8)
    last = np.maximum.accumulate(np.where(known, np.arange(len(sequence)), 0))
    return values[last]


def gather_index(starts: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The token positions of inputs ``rows`` back to back, in that order (one vectorised gather)."""
    sizes = lengths[rows]
    total = int(sizes.sum())
    shift = starts[rows] - (np.cumsum(sizes) - sizes)
    return np.repeat(shift, sizes) + np.arange(total, dtype=np.int64)


class TokenColumns:
    """One batch's tokens back to back: what the packed forward and the device pools read.
    ``type_ids`` None: all 0; ``word_ids`` (-1 for special tokens) and ``segments``: gathered from
    the block on first use, None for units that have none (windows, the cache's contexts: nothing
    pools them on the device)."""

    def __init__(
        self,
        lengths: list[int],
        ids: np.ndarray,
        type_ids: np.ndarray | None = None,
        word_ids: np.ndarray | None = None,
        segments: np.ndarray | None = None,
        source: tuple[EncodedBlock, np.ndarray] | None = None,  # (block, token positions): lazy columns
    ) -> None:
        self.lengths, self.ids, self.type_ids = lengths, ids, type_ids
        self._word_ids, self._segments, self._source = word_ids, segments, source

    @property
    def word_ids(self) -> np.ndarray | None:
        if self._word_ids is None and self._source is not None:
            block, index = self._source
            self._word_ids = block.word_ids[index]
        return self._word_ids

    @property
    def segments(self) -> np.ndarray | None:
        if self._segments is None and self._source is not None:
            block, index = self._source
            self._segments = block.segments[index]
        return self._segments

    @classmethod
    def of_units(cls, units: Sequence[Any]) -> TokenColumns:
        """From per-input objects with ``.ids`` and ``.type_ids`` (EncodedInput, Window, TokenUnit);
        word ids and segments too where they have them (EncodedInput)."""
        lengths = [len(u) for u in units]
        n = sum(lengths)
        ids = np.fromiter(chain.from_iterable(u.ids for u in units), np.int64, count=n)
        types = np.fromiter(chain.from_iterable(u.type_ids for u in units), np.int64, count=n)
        word_ids = segments = None
        if units and all(isinstance(u, EncodedInput) for u in units):
            word_ids = _no_none(chain.from_iterable(u.word_ids for u in units), np.int32)
            starts = np.cumsum([0, *lengths[:-1]]).astype(np.int64)
            sequence = _no_none(chain.from_iterable(u.sequence_ids for u in units), np.int8)
            segments = _fill_segments(sequence, starts)
        return cls(lengths, ids, types, word_ids, segments)

    @property
    def starts(self) -> np.ndarray:
        """(B,) where each input's tokens begin."""
        return np.cumsum([0, *self.lengths[:-1]]).astype(np.int64)


def _no_none(values: Any, dtype: type) -> np.ndarray:
    """Ints with None for -1, as ``dtype``: NumPy reads None as NaN in a float array (a C loop)."""
    floats = np.array(list(values), dtype=np.float64)
    return np.nan_to_num(floats, nan=-1).astype(dtype)


@dataclass(eq=False)
class EncodedBlock:
    """Inputs ``first .. first + B - 1`` of a call, tokenised (see the module's docstring). Built by
    ``InputEncoder.encode_block``; ``item(i)`` is input ``first + i`` as an :class:`EncodedInput`."""

    texts: list[str]
    text_pairs: list[str] | None
    words: list[tuple[str, ...]] | None
    encodings: list[Any]  # tokenizers.Encoding, one per input
    lengths: np.ndarray  # (B,) tokens of each input as it runs (after truncation)
    truncated: np.ndarray  # (B,) bool
    n_untruncated: np.ndarray  # (B,) tokens before truncation (a lower bound where not counts_exact)
    words_lost: np.ndarray  # (B,)
    counts_exact: np.ndarray  # (B,) bool
    # by row: the pre-split words that produced no token
    words_empty: dict[int, tuple[int, ...]] = field(default_factory=dict)
    first: int = 0  # the call's index of this block's first input
    # False: tokenised without offsets and word ids (the fast tokenizer's encode_batch_fast), for
    # a call that reads neither (sentence vectors of all tokens or the first)
    detailed: bool = True
    source: Any = None  # the InputEncoder: its vocabulary turns ids into token strings

    def __len__(self) -> int:
        return len(self.encodings)

    @cached_property
    def starts(self) -> np.ndarray:  # (B + 1,): input i's tokens are starts[i]:starts[i + 1]
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)

    @cached_property
    def bounds(self) -> list[int]:  # starts as Python ints (per-input slicing without NumPy scalars)
        return self.starts.tolist()

    @property
    def n_tokens(self) -> int:
        return int(self.starts[-1])

    def _column(self, attribute: str, dtype: type) -> np.ndarray:
        values = chain.from_iterable(getattr(e, attribute) for e in self.encodings)
        return np.fromiter(values, dtype, count=self.n_tokens)

    @cached_property
    def ids(self) -> np.ndarray:
        return self._column("ids", np.int64)

    @cached_property
    def type_ids(self) -> np.ndarray:
        return self._column("type_ids", np.int64)

    def _check_detailed(self, what: str) -> None:
        if not self.detailed:  # a bug, never the user's: the caller asked for a lean block
            raise AssertionError(f"this block was tokenised without {what} (encode_block(detailed=False))")

    @cached_property
    def word_ids(self) -> np.ndarray:  # -1 for special tokens
        self._check_detailed("word ids")
        return _no_none(chain.from_iterable(e.word_ids for e in self.encodings), np.int32)

    @cached_property
    def segments(self) -> np.ndarray:
        if self.text_pairs is None:  # one text per input: every token is in segment 0
            return np.zeros(self.n_tokens, dtype=np.int8)
        self._check_detailed("segments")
        sequence = _no_none(chain.from_iterable(e.sequence_ids for e in self.encodings), np.int8)
        return _fill_segments(sequence, self.starts[:-1])

    @cached_property
    def offsets(self) -> np.ndarray:  # (N, 2) int32; pre-split words: spans in " ".join(words)
        self._check_detailed("offsets")
        flat = chain.from_iterable(chain.from_iterable(e.offsets for e in self.encodings))
        offsets = np.fromiter(flat, np.int32, count=2 * self.n_tokens).reshape(-1, 2)
        if self.words is None:
            return offsets
        for i, words in enumerate(self.words):  # shift each word's own offsets into the joined text
            lo, hi = self.starts[i], self.starts[i + 1]
            word_ids = self.word_ids[lo:hi]
            begins = np.cumsum([0, *[len(w) + 1 for w in words[:-1]]]).astype(np.int32)
            special = word_ids < 0
            part = offsets[lo:hi] + begins[np.where(special, 0, word_ids)][:, None]
            part[special] = 0
            offsets[lo:hi] = part
        return offsets

    @cached_property
    def _token_strings(self) -> np.ndarray | None:  # every token's string: one gather per block
        built = self.source is not None and "vocabulary" in vars(self.source)
        if not built and self.n_tokens < VOCABULARY_FROM:  # a few tokens: not worth the table
            return None
        vocabulary = getattr(self.source, "vocabulary", None)
        return None if vocabulary is None else vocabulary[self.ids]

    def tokens(self, i: int) -> tuple[str, ...]:
        strings = self._token_strings
        if strings is None:
            return tuple(self.encodings[i].tokens)
        return tuple(strings[self.bounds[i] : self.bounds[i + 1]].tolist())

    def columns(self, rows: np.ndarray) -> TokenColumns:
        """Inputs ``rows`` (of this block) back to back, as the forward and the device pools read them."""
        index = gather_index(self.starts, self.lengths, rows)
        return TokenColumns(
            self.lengths[rows].tolist(), self.ids[index], self.type_ids[index], source=(self, index)
        )

    def item(self, i: int) -> EncodedInput:
        """Input ``first + i`` as an :class:`EncodedInput` (tuples: built on request only)."""
        self._check_detailed("offsets and word ids")
        enc = self.encodings[i]
        lo, hi = self.starts[i], self.starts[i + 1]
        return EncodedInput(
            index=self.first + i,
            text=self.texts[i],
            text_pair=self.text_pairs[i] if self.text_pairs is not None else None,
            words=self.words[i] if self.words is not None else None,
            ids=tuple(enc.ids),
            type_ids=tuple(enc.type_ids),
            tokens=tuple(enc.tokens),
            offsets=tuple(map(tuple, self.offsets[lo:hi].tolist())),
            word_ids=tuple(enc.word_ids),
            sequence_ids=tuple(enc.sequence_ids),
            truncated=bool(self.truncated[i]),
            n_tokens_untruncated=int(self.n_untruncated[i]),
            words_lost=int(self.words_lost[i]),
            counts_exact=bool(self.counts_exact[i]),
            words_empty=self.words_empty.get(i, ()),
        )

    def items(self) -> list[EncodedInput]:
        return [self.item(i) for i in range(len(self))]
