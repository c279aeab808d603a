"""Texts, sentence pairs and pre-split words → token ids with everything needed to map back.

Three input forms, one output type (:class:`EncodedInput`):

* ``texts``            raw strings; ``text_pairs`` optionally gives each a second segment
* ``pairs``            ``(first, second)`` tuples, encoded as ``[CLS] A [SEP] B [SEP]``
* ``words``            pre-split words (CoNLL-style data); ``word_ids`` point into the caller's list

Tokenisation runs on private copies of the fast tokenizer's Rust backend with padding switched off
(the packaged all-MiniLM-L6-v2 ``tokenizer.json`` pads every input to 128 tokens) so that a batch is
never padded beyond its longest text. Texts longer than the model's maximum are truncated
(``longest_first`` for pairs) and flagged, never silently cut.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from ..errors import InputError, OptionError
from .words import empty_words, word_keys, word_offsets_to_text

logger = logging.getLogger("layerwise")


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
    out = np.zeros(len(sequence_ids), dtype=np.int8)
    current = 0
    for position, sequence in enumerate(sequence_ids):
        if sequence is not None:
            current = sequence
        out[position] = current
    return out


def _check_str(value: object, what: str, index: int) -> str:
    if not isinstance(value, str):
        raise InputError(
            f"{what} is {type(value).__name__} ({value!r:.60}), expected str; "
            "convert it with str() or drop it",
            index=index,
        )
    position = lone_surrogate(value)
    if position is not None:
        raise InputError(
            f"{what} holds the lone surrogate U+{ord(value[position]):04X} at character {position}, which "
            "is not valid Unicode; repair it, e.g. text.encode('utf-8', 'replace').decode()",
            index=index,
        )
    return value


def as_texts(values: object, name: str = "texts") -> list:
    """``values`` as a list, from any iterable of strings: a list or tuple, a pandas or polars
    Series, a NumPy array, a pyarrow Array or ChunkedArray (through ``to_pylist``, so that nulls
    become None and are refused by name), a generator. A single string is refused: wrap it in a
    list. The items are checked later (normalize_inputs), each naming its index."""
    if isinstance(values, str | bytes):
        raise InputError(f"{name} must be a list of strings; wrap a single text in a list")
    if isinstance(values, list):
        return values
    to_pylist = getattr(values, "to_pylist", None)  # pyarrow: items would be scalars, not str
    if callable(to_pylist):
        return list(to_pylist())
    try:
        return list(values)  # type: ignore[call-overload]
    except TypeError:
        raise InputError(f"{name} must be an iterable of strings, not {type(values).__name__}") from None


def lone_surrogate(text: str) -> int | None:
    """Position of the first lone surrogate in ``text`` (not text: a broken "\ud800" escape,
    often), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _check_words(value: object, index: int) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InputError(
            f"words[{index}] is {type(value).__name__}, expected a list of words such as "
            "['Pre', 'split', 'words']; pass raw strings with texts= instead",
            index=index,
        )
    words = tuple(value)
    for j, word in enumerate(words):
        _check_str(word, f"words[{index}][{j}]", index)
        if not word:  # (a whitespace-only word is kept: it gets a zero vector, like "\u200b")
            raise InputError(
                f"words[{index}][{j}] is {word!r}: an empty word is most often a parsing slip (a doubled "
                "separator); remove it, or pass a placeholder such as '_'",
                index=index,
            )
    return words


@dataclass(frozen=True, slots=True)
class RawInputs:
    """Validated input in one of the three forms."""

    texts: list[str]
    text_pairs: list[str] | None
    words: list[tuple[str, ...]] | None
    field: str = "texts"  # the argument they came in as: texts, pairs or words (for messages)

    def __len__(self) -> int:
        return len(self.texts)


def normalize_inputs(
    texts: Sequence[str] | None = None,
    *,
    text_pairs: Sequence[str] | None = None,
    pairs: Sequence[tuple[str, str]] | None = None,
    words: Sequence[Sequence[str]] | None = None,
) -> RawInputs:
    """Check the inputs and bring them into one form. Exactly one of ``texts``, ``pairs`` and
    ``words`` must be given; ``text_pairs`` only together with ``texts``."""
    if text_pairs is not None and texts is None:
        raise InputError("text_pairs= needs texts= with one first segment per pair")
    given = [name for name, v in (("texts", texts), ("pairs", pairs), ("words", words)) if v is not None]
    if len(given) != 1:
        raise InputError(f"pass exactly one of texts=, pairs= or words= (got {', '.join(given) or 'none'})")
    if texts is not None:
        checked = [_check_str(t, f"texts[{i}]", i) for i, t in enumerate(as_texts(texts))]
        seconds = None
        if text_pairs is not None:
            if isinstance(text_pairs, str):
                raise InputError("text_pairs must be a list of strings, one per text")
            text_pairs = as_texts(text_pairs, "text_pairs")
            if len(text_pairs) != len(checked):
                raise InputError(
                    f"texts has {len(checked)} items but text_pairs has {len(text_pairs)}; "
                    "pass exactly one second segment per text"
                )
            seconds = [_check_str(t, f"text_pairs[{i}]", i) for i, t in enumerate(text_pairs)]
        return RawInputs(checked, seconds, None)
    if pairs is not None:
        firsts, seconds = [], []
        for i, pair in enumerate(pairs):
            if isinstance(pair, str) or not isinstance(pair, Sequence) or len(pair) != 2:
                size = len(pair) if isinstance(pair, Sequence) and not isinstance(pair, str) else "not a pair"
                raise InputError(
                    f"pairs[{i}] must be a (first, second) tuple of two strings, got {pair!r:.80} "
                    f"({size} items)",
                    index=i,
                )
            firsts.append(_check_str(pair[0], f"pairs[{i}][0]", i))
            seconds.append(_check_str(pair[1], f"pairs[{i}][1]", i))
        return RawInputs(firsts, seconds, None, "pairs")
    assert words is not None
    if isinstance(words, str):
        raise InputError("words must be a list of word lists, e.g. [['Pre', 'split', 'words']]")
    word_lists = [_check_words(w, i) for i, w in enumerate(words)]
    return RawInputs([" ".join(w) for w in word_lists], None, word_lists, "words")


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

    def encode(self, raw: RawInputs, *, truncate: bool = True) -> list[EncodedInput]:
        """Tokenise. With ``truncate=False`` inputs longer than ``max_length`` are kept whole
        (for sliding windows); otherwise they are cut and flagged."""
        if not len(raw):
            return []
        if raw.text_pairs is not None and not self.pairs:
            raise InputError(
                "this model is a decoder language model: it has no segments, so it takes no text pairs. "
                "Join each pair into one text with a separator you choose, e.g. f'{a}\\n{b}'"
            )
        if raw.words is not None:
            batch: list = [list(w) for w in raw.words]
            pretokenized = True
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
        encodings = self._free.encode_batch(batch, is_pretokenized=pretokenized)
        lengths = [len(e.ids) for e in encodings]
        too_long = [i for i, n in enumerate(lengths) if n > self.max_length] if truncate else []
        full_words = {i: word_keys(encodings[i]) for i in too_long}
        if too_long:
            capped = self._capped.encode_batch([batch[i] for i in too_long], is_pretokenized=pretokenized)
            for i, enc in zip(too_long, capped, strict=True):
                encodings[i] = enc
        lost = {i: len(full_words[i] - word_keys(encodings[i])) for i in too_long}
        for i, (enc, n_tokens, n_lost) in bounded.items():
            encodings[i], lengths[i], lost[i] = enc, n_tokens, n_lost
        too_long_set = set(too_long) | set(bounded)
        if raw.words is not None:
            # pre-split words: every word after the last one that kept a token is lost, including
            # words that would have had no token anyway (a trailing " " or "\u200b")
            for i in too_long_set:
                present = [w for w in encodings[i].word_ids if w is not None]
                lost[i] = len(raw.words[i]) - (max(present) + 1 if present else 0)
        out = []
        for i, enc in enumerate(encodings):
            ids = tuple(enc.ids)  # each .ids builds a new list from the Rust encoding: once here
            if not ids:
                raise self._no_tokens(i, raw)
            if self.vocab_size is not None and ids and max(ids) >= self.vocab_size:
                raise self._unknown_id(i, ids, enc.tokens, raw)
            offsets = enc.offsets
            if raw.words is not None:
                offsets = word_offsets_to_text(offsets, enc.word_ids, raw.words[i])
            out.append(
                EncodedInput(
                    index=i,
                    text=raw.texts[i],
                    text_pair=raw.text_pairs[i] if raw.text_pairs is not None else None,
                    words=raw.words[i] if raw.words is not None else None,
                    ids=ids,
                    type_ids=tuple(enc.type_ids),
                    tokens=tuple(enc.tokens),
                    offsets=tuple((int(a), int(b)) for a, b in offsets),
                    word_ids=tuple(enc.word_ids),
                    sequence_ids=tuple(enc.sequence_ids),
                    truncated=i in too_long_set,
                    n_tokens_untruncated=lengths[i],
                    words_lost=lost.get(i, 0),
                    counts_exact=i not in bounded,
                    words_empty=empty_words(enc, raw.words[i], i in too_long_set) if raw.words else (),
                )
            )
        return out

    def _no_tokens(self, i: int, raw: RawInputs) -> InputError:
        # only a tokenizer that adds no special token (GPT-2's, Qwen2's: no BOS) gives an input none:
        # an empty text, or one of characters its byte-level vocabulary has no bytes for (it drops them)
        return InputError(
            f"input {i} ({raw.texts[i]!r:.60}) gives no tokens: this model's tokenizer adds no BOS or "
            "other special token, and the input is empty or made of characters its vocabulary cannot "
            "represent; leave such inputs out",
            index=i,
        )

    def _unknown_id(self, i: int, ids: tuple[int, ...], tokens: list[str], raw: RawInputs) -> InputError:
        top = max(ids)
        token = tokens[ids.index(top)]
        return InputError(
            f"tokenizer and model disagree: input {i} ({raw.texts[i]!r:.60}) has token {token!r} "
            f"with id {top} >= the model's vocab size {self.vocab_size}; the tokenizer is not the "
            "one this model was trained with: load the model with its own tokenizer files",
            index=i,
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


def report_empty_words(encoded: Sequence[EncodedInput]) -> None:
    """One warning for all pre-split words of a call that produced no wordpiece."""
    hit = [e for e in encoded if e.words_empty]
    if hit:
        first = hit[0]
        word = first.words[first.words_empty[0]] if first.words else ""
        logger.warning(
            "%d words in %d inputs produced no wordpiece (first: input %d, word %d, %r); they keep their "
            "slot with a zero vector and are listed in words_empty",
            sum(len(e.words_empty) for e in hit), len(hit), first.index, first.words_empty[0], word,
        )  # fmt: skip


def report_truncation_warning(encoded: Sequence[EncodedInput], max_length: int) -> None:
    """One warning for all truncated inputs of a call, with counts ("at least" where bounded)."""
    truncated = [e for e in encoded if e.truncated]
    if not truncated:
        return
    first = truncated[0]
    bound = "" if all(e.counts_exact for e in truncated) else "at least "
    logger.warning(
        "%d of %d inputs were longer than %d tokens and were truncated (first: input %d, %s%d tokens; "
        "%s%d words lost in all); their results have truncated=True. Pass long_texts='window' "
        "to keep every token with sliding windows.",
        len(truncated),
        len(encoded),
        max_length,
        first.index,
        "" if first.counts_exact else "at least ",
        first.n_tokens_untruncated,
        bound,
        sum(e.words_lost for e in truncated),
    )
