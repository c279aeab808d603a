"""Texts, sentence pairs and pre-split words → token ids with everything needed to map back.

Three input forms, one output type (:class:`EncodedInput`):

* ``texts``            raw strings; ``text_pairs`` optionally gives each a second segment
* ``pairs``            ``(first, second)`` tuples, encoded as ``[CLS] A [SEP] B [SEP]``
* ``words``            pre-split words (CoNLL-style data); ``word_ids`` point into the caller's list

(checked and brought into one form, :class:`~layerwise._inputs.raw.RawInputs`, by raw.py).

Tokenisation runs on private copies of the fast tokenizer's Rust backend with padding switched off
(the packaged all-MiniLM-L6-v2 ``tokenizer.json`` pads every input to 128 tokens) so that a batch is
never padded beyond its longest text. Texts longer than the model's maximum are truncated
(``longest_first`` for pairs) and flagged, never silently cut.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from ..errors import InputError, OptionError
from .block import EncodedBlock, EncodedInput, segment_ids
from .raw import RawInputs
from .words import empty_words, word_keys

__all__ = ["EncodedBlock", "EncodedInput", "InputEncoder", "segment_ids"]

logger = logging.getLogger("layerwise")


class InputEncoder:
    """Tokenises :class:`RawInputs` with a fast tokenizer, truncating to ``max_length``."""

    def __init__(
        self,
        backend: Tokenizer,
        max_length: int,
        *,
        special_tokens_in_text: bool = False,
        vocab_size: int | None = None,
        pairs: bool = True,
    ) -> None:
        if max_length < 2:
            raise OptionError(f"max_length={max_length} leaves no room for [CLS] and [SEP]; use >= 2")
        self.max_length = max_length
        self.pairs = pairs  # False for a decoder LM: it has no segments to tell two texts apart
        # The model's embedding rows: an id at or above them fails the forward with an IndexError,
        # and in a server that would fail every request merged into the same run; checked here,
        # before an input joins a batch, it is this input's own error.
        self.vocab_size = vocab_size
        # Private copies: the caller's tokenizer keeps its settings, and no shared state is
        # switched back and forth between calls (so encoding is thread-safe).
        self._free = Tokenizer.from_str(backend.to_str())
        self._free.no_padding()
        self._free.no_truncation()
        self._capped = Tokenizer.from_str(backend.to_str())
        self._capped.no_padding()
        self._capped.enable_truncation(max_length, strategy="longest_first")
        # "[SEP]" typed in a text is text, not a segment boundary: user text never becomes a
        # special token (the template still adds the real [CLS]/[SEP]). The logit lens alone asks
        # for "[MASK]" in a text to be the mask token (special_tokens_in_text=True).
        self._free.encode_special_tokens = not special_tokens_in_text
        self._capped.encode_special_tokens = not special_tokens_in_text

    @functools.cached_property
    def vocabulary(self) -> np.ndarray | None:
        """Each token id's string (an object array), so that a block's tokens are one gather; None
        when a probe finds a token string that is not its id's entry (then each encoding's own
        tokens are read)."""
        entries = self._free.get_vocab(with_added_tokens=True)
        strings = np.empty(max(entries.values(), default=-1) + 1, dtype=object)
        for token, i in entries.items():
            strings[i] = token
        probe = self._free.encode("Ünïcödé déjà-vu 😀, [SEP] x\u200by 日本語 12.5% naïve <unk> </s>")
        return strings if tuple(strings[probe.ids].tolist()) == tuple(probe.tokens) else None

    def capped_tokenizer(self) -> Tokenizer:
        """The tokenizer as the forward sees it: truncating at ``max_length``, no padding (a
        benchmark's limit: its batch call alone)."""
        return self._capped

    def encode(self, raw: RawInputs, *, truncate: bool = True) -> list[EncodedInput]:
        """Tokenise. With ``truncate=False`` inputs longer than ``max_length`` are kept whole
        (for sliding windows); otherwise they are cut and flagged."""
        return self.encode_block(raw, truncate=truncate).items()

    def encode_block(
        self, raw: RawInputs, *, truncate: bool = True, first: int = 0, detailed: bool = True
    ) -> EncodedBlock:
        """:meth:`encode` as arrays (block.py): no per-input object is built. ``first``: the call's
        index of ``raw``'s first input (a block of a longer call), for errors and results.
        ``detailed=False``: without offsets and word ids (the fast tokenizer's leaner batch call),
        for a call that reads neither; single texts cut at the maximum only (else it is ignored)."""
        if not len(raw):
            raw = RawInputs([], None, None)  # nothing to tokenise: no check of the form applies
        if raw.text_pairs is not None and not self.pairs:
            raise InputError(
                "this model is a decoder language model: it has no segments, so it takes no text pairs. "
                "Join each pair into one text with a separator you choose, e.g. f'{a}\\n{b}'"
            )
        if raw.words is not None:
            batch: list = [list(w) for w in raw.words]
            pretokenized = detailed = True  # their empty words are found from word ids
        elif raw.text_pairs is not None:
            batch = list(zip(raw.texts, raw.text_pairs, strict=True))
            pretokenized = False
        else:
            batch = list(raw.texts)
            pretokenized = False
        # Very long single inputs are tokenised only as far as truncation needs (a 20 MB line took
        # 43 s and 4.4 GB to count the words it would lose); pairs are cut longest_first, which
        # depends on both whole lengths, so they are tokenised whole.
        bounded: dict[int, tuple] = {}
        if truncate and raw.text_pairs is None:
            for i, item in enumerate(batch):
                if len(item) > self.max_length * (8 if pretokenized else 64):
                    found = self._prefix_encoding(item, pretokenized)
                    if found is not None:
                        bounded[i] = found
                        batch[i] = [] if pretokenized else ""  # nothing left to tokenise here
        if truncate and raw.text_pairs is None:
            encodings, lengths, untruncated, lost = self._capped_batch(batch, pretokenized, detailed)
            too_long = np.flatnonzero(untruncated > lengths).tolist()
        else:  # pairs are cut longest_first: counted whole, then cut; windows keep every token
            detailed = True
            encodings, lengths, untruncated, lost, too_long = self._whole_batch(batch, pretokenized, truncate)
        for i, (enc, n_tokens, n_lost) in bounded.items():
            encodings[i], lengths[i], untruncated[i], lost[i] = enc, len(enc), n_tokens, n_lost
        truncated = np.zeros(len(encodings), dtype=bool)
        truncated[too_long] = True
        truncated[list(bounded)] = True
        exact = np.ones(len(encodings), dtype=bool)
        exact[list(bounded)] = False
        empty = {} if raw.words is None else _word_losses(raw.words, encodings, truncated, lost)
        block = EncodedBlock(
            raw.texts,
            raw.text_pairs,
            raw.words,
            encodings,
            lengths,
            truncated,
            untruncated,
            lost,
            exact,
            empty,
            first,
            detailed,
            self,
        )
        self._check_ids(block, raw)
        return block

    def _whole_batch(self, batch: list, pretokenized: bool, truncate: bool) -> tuple:
        """One batch call tokenising each input whole, then (``truncate``) those past the maximum
        again with the model's truncation: ``(encodings, lengths, whole lengths, words lost, the
        inputs cut)``."""
        encodings = self._free.encode_batch(batch, is_pretokenized=pretokenized) if batch else []
        lengths = np.fromiter((len(e) for e in encodings), np.int64, count=len(encodings))
        untruncated = lengths.copy()
        too_long = np.flatnonzero(lengths > self.max_length).tolist() if truncate else []
        lost = np.zeros(len(encodings), dtype=np.int64)
        if too_long:
            full_words = {i: word_keys(encodings[i]) for i in too_long}
            capped = self._capped.encode_batch([batch[i] for i in too_long], is_pretokenized=pretokenized)
            for i, enc in zip(too_long, capped, strict=True):
                encodings[i] = enc
                lengths[i] = len(enc)
                lost[i] = len(full_words[i] - word_keys(enc))
        return encodings, lengths, untruncated, lost, too_long

    def _capped_batch(self, batch: list, pretokenized: bool, detailed: bool) -> tuple:
        """One batch call with the model's truncation: ``(encodings, lengths, lengths before the cut,
        words lost)``. A cut input's rest comes back as overflowing pieces (stride 0: no overlap),
        each wrapped in the special tokens again: they give its full length and its lost words
        (from a detailed encoding of the cut inputs alone, when the call was lean)."""
        if not batch:
            empty = np.zeros(0, dtype=np.int64)
            return [], empty, empty.copy(), empty.copy()
        encode = self._capped.encode_batch if detailed else self._capped.encode_batch_fast
        encodings = encode(batch, is_pretokenized=pretokenized)
        lengths = np.fromiter((len(e) for e in encodings), np.int64, count=len(encodings))
        untruncated, lost = lengths.copy(), np.zeros(len(encodings), dtype=np.int64)
        cut = [i for i, enc in enumerate(encodings) if enc.overflowing]
        if not cut:
            return encodings, lengths, untruncated, lost
        processor = self._capped.post_processor
        added = processor.num_special_tokens_to_add(False) if processor is not None else 0
        detail: Any = encodings
        if not detailed:  # the lean call has no word ids: the cut inputs again, in detail
            again = self._capped.encode_batch([batch[i] for i in cut], is_pretokenized=pretokenized)
            detail = dict(zip(cut, again, strict=True))
        for i in cut:
            pieces = detail[i].overflowing
            untruncated[i] = lengths[i] + sum(len(piece) - added for piece in pieces)
            lost[i] = len(set().union(*(word_keys(piece) for piece in pieces)) - word_keys(detail[i]))
        return encodings, lengths, untruncated, lost

    def _check_ids(self, block: EncodedBlock, raw: RawInputs) -> None:
        """The first input (in input order) with no token, or a token id past the model's rows."""
        bad = [int(i) for i in np.flatnonzero(block.lengths == 0)[:1]]
        if self.vocab_size is not None and block.n_tokens and int(block.ids.max()) >= self.vocab_size:
            position = int(np.argmax(block.ids >= self.vocab_size))
            bad.append(int(np.searchsorted(block.starts, position, side="right")) - 1)
        if not bad:
            return
        i = min(bad)
        if block.lengths[i] == 0:
            raise self._no_tokens(i, raw, block.first)
        enc = block.encodings[i]
        raise self._unknown_id(i, tuple(enc.ids), enc.tokens, raw, block.first)

    def _no_tokens(self, i: int, raw: RawInputs, first: int = 0) -> InputError:
        # only a tokenizer that adds no special token (GPT-2's, Qwen2's: no BOS) gives an input none:
        # an empty text, or one of characters its byte-level vocabulary has no bytes for (it drops them)
        return InputError(
            f"input {first + i} ({raw.texts[i]!r:.60}) gives no tokens: this model's tokenizer adds no BOS "
            "or other special token, and the input is empty or made of characters its vocabulary cannot "
            "represent; leave such inputs out",
            index=first + i,
        )

    def _unknown_id(
        self, i: int, ids: tuple[int, ...], tokens: list[str], raw: RawInputs, first: int = 0
    ) -> InputError:
        top = max(ids)
        token = tokens[ids.index(top)]
        return InputError(
            f"tokenizer and model disagree: input {first + i} ({raw.texts[i]!r:.60}) has token {token!r} "
            f"with id {top} >= the model's vocab size {self.vocab_size}; the tokenizer is not the "
            "one this model was trained with: load the model with its own tokenizer files",
            index=first + i,
        )

    def _prefix_encoding(self, item, pretokenized: bool):
        """``(truncated encoding, tokens in the prefix, words lost in the prefix)`` from a prefix of
        ``item`` (characters of a text, or words of a word list) long enough that truncating it
        gives exactly what truncating the whole input gives, or None when no prefix is shorter.

        Normalisation, pre-tokenisation and WordPiece/BPE act word by word, so every token of a word
        that ends before the prefix's last (possibly cut) word is the same as in the whole input;
        the prefix is grown until every kept token belongs to such a word."""
        limit = self.max_length * (2 if pretokenized else 16)
        while limit < len(item):
            prefix = item[:limit]
            free = self._free.encode(prefix, is_pretokenized=pretokenized)
            if len(free.ids) > self.max_length:
                capped = self._capped.encode(prefix, is_pretokenized=pretokenized)
                kept = [w for w in capped.word_ids if w is not None]
                last = max((w for w in free.word_ids if w is not None), default=-1)
                if kept and max(kept) < last:
                    return capped, len(free.ids), len(word_keys(free) - word_keys(capped))
            limit *= 4
        return None


def _word_losses(
    words: Sequence[Sequence[str]], encodings: list, truncated: np.ndarray, lost: np.ndarray
) -> dict[int, tuple[int, ...]]:
    """Pre-split words' losses: every word after the last one that kept a token is lost (``lost``
    set for each cut input), including words that would have had no token anyway (a trailing " "
    or "\u200b"); and each input's words that have no token (its index -> their numbers)."""
    for i in np.flatnonzero(truncated).tolist():
        present = [w for w in encodings[i].word_ids if w is not None]
        lost[i] = len(words[i]) - (max(present) + 1 if present else 0)
    empty: dict[int, tuple[int, ...]] = {}
    for i, enc in enumerate(encodings):
        found = empty_words(enc, words[i], bool(truncated[i]))
        if found:
            empty[i] = found
    return empty
