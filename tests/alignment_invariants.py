"""Alignment invariants over arbitrary Unicode input, shared by the hypothesis tests
(tests/test_fuzz_alignment.py, a few hundred examples) and benchmarks/fuzz_alignment.py (10,000).

Each ``check_*`` function takes an Encoder and one generated input and asserts what must hold for
every input: one hidden row per token at every layer, offsets inside the text pointing at the
characters the token came from, word ids monotone within a segment, one word vector per input
word, windowed results equal to unwindowed ones for inputs that fit. The tokens of one span spell
its characters: WordPiece pieces against BERT's normalisation, a decoder's byte-level or
SentencePiece-style pieces through the tokenizer's own decoder.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import strategies as st

from layerwise.errors import InputError

# Characters that break naive alignment code, mixed with anything Unicode has (no surrogates).
AWKWARD = [
    " ", "  ", "\t", "\n", "\u00a0", "\u3000",  # whitespace, incl. no-break and ideographic
    "\u0301", "\u0308", "\u20dd",  # combining marks (Mn, Mn, Me)
    "\u200b", "\u200d", "\u00ad", "\ufeff", "\u2060",  # zero-width, soft hyphen, BOM, word joiner
    "\x00", "\x07", "\x1b", "\ufffd",  # control, replacement character
    "😀", "👩\u200d👩\u200d👧", "🇫🇷", "👍🏽",  # emoji, ZWJ sequence, flag, skin tone
    "中文", "日本語", "한국어",  # CJK
    "مرحبا", "שלום", "\u202e",  # RTL scripts and the right-to-left override
    "Ünïcödé", "İstanbul", "ß", "ﬁ", "Ω", "привет", "ελληνικά",  # case and accent corner cases
    "don't", "U.S.A.", "e-mail", "3.14", "#hashtag", "@user", "[SEP]", "[CLS]", "[MASK]", "<s>",
    "a" * 120, "x" * 30 + "é" * 30,  # very long "words"
]  # fmt: skip

_piece = st.one_of(
    st.sampled_from(AWKWARD),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=6),
    st.sampled_from(["the", "bank", "river", "raised", "rates", ".", ",", "!", "?"]),
)
texts = st.lists(_piece, max_size=40).map("".join)
words = st.lists(_piece.filter(lambda w: w != ""), min_size=1, max_size=25)


def _bert_normalise(text: str) -> str:
    """What the uncased BERT normaliser does to characters: drop control/format characters
    (category C*) and U+FFFD, lowercase, NFD, drop nonspacing marks (Mn)."""
    kept = "".join(c for c in text if not unicodedata.category(c).startswith("C") and c != "\ufffd")
    decomposed = unicodedata.normalize("NFD", kept.lower())
    return "".join(c for c in decomposed if unicodedata.category(c) != "Mn")


def _spelled_bert(pieces: list[str], source: str) -> tuple[str, str]:
    """WordPiece: the pieces without ``##`` against the BERT-normalised characters."""
    return "".join(p.removeprefix("##") for p in pieces), _bert_normalise(source)


def _spelled_decoder(tokenizer) -> Callable[[list[str], str], tuple[str, str]]:
    """Byte-level BPE and SentencePiece-style BPE: the tokenizer's own decoder turns the pieces back
    into text (``Ġ``/``▁`` into spaces, byte tokens into characters); both sides in NFC (Qwen2's
    tokenizer composes characters) and without surrounding whitespace (the space a marker stands
    for lies outside the word's span, or inside it, by tokenizer)."""

    # a tokenizer that normalises with NFKC (T5's, DeBERTa-v3's) spells compatibility characters
    # by their decomposition ("ﬁ" as "fi"), and SentencePiece folds runs of spaces to one
    form = _normal_form(tokenizer) or "NFC"

    def spelled(pieces: list[str], source: str) -> tuple[str, str]:
        text = tokenizer.convert_tokens_to_string(pieces)
        folded = unicodedata.normalize(form, source)
        if form == "NFKC":
            folded = re.sub(" {2,}", " ", folded)
        return unicodedata.normalize(form, text).strip(), folded.strip()

    return spelled


def _marks_end(source: str, start: int, end: int, form: str) -> int:
    """Where ``source[start:end]`` ends with the combining marks right after it that composition
    folds into its last character: a normaliser that composes "A" + U+0301 into "Á" gives the
    composed token the first character's span only (tokenizers' alignment of a composition), so its
    spelling is read with the marks it took in. Under NFKC a compatibility character's expansion can
    take the mark in: "ﬁ" + U+0301 is "fí", whose "í" tokenizers align to the mark, so the tokens over
    the ligature and over the mark spell it together. A mark nothing composes with ("t" + U+0301) is
    a token of its own."""
    while end < len(source) and unicodedata.combining(source[end]):
        if len(unicodedata.normalize(form, source[start : end + 1])) > len(
            unicodedata.normalize(form, source[start:end])
        ):
            break
        end += 1
    return end


def _spells(spelled: str, expected: str, cut: bool) -> bool:
    """The tokens spell their span: all of it, or its start where truncation cut the last run."""
    return expected.startswith(spelled.rstrip("\ufffd")) if cut else expected == spelled


def _marks_before(source: str, start: int, form: str) -> str:
    """The combining marks that end the normal form of the character before ``start``: canonical
    ordering can move them behind a mark of a lower class that starts ``start``'s token. Under NFKC
    "¯" (U+00AF) is a space and U+0304, and "¯" + U+0F7A is " " + U+0F7A + U+0304: T5's and
    DeBERTa-v3's tokenizers give "▁" the macron's span and the token U+0F7A U+0304 the vowel sign's
    alone, so that token spells its span with the macron the character before brought."""
    before = unicodedata.normalize(form, source[start - 1]) if start > 0 else ""
    marks = len(before)
    while marks > 0 and unicodedata.combining(before[marks - 1]):
        marks -= 1
    return before[marks:]


@dataclass(frozen=True)
class TokenizerFacts:
    model: str  # "WordPiece", "BPE", "Unigram"
    normalizer: str  # the normaliser's JSON
    lost_bytes: frozenset[int]  # bytes_not_in_vocabulary


# read once per tokenizer: serialising SmolLM2's 49,152-token tokenizer takes about 0.2 s, and the
# checks of one input read these facts three times
_FACTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def facts_of(tokenizer) -> TokenizerFacts:
    """What the checks read from the tokenizer's serialised state (its model kind, its normaliser)
    and its vocabulary (the bytes it lacks)."""
    facts = _FACTS.get(tokenizer)
    if facts is None:
        state = json.loads(tokenizer.backend_tokenizer.to_str())
        lost: frozenset[int] = frozenset()
        if "ByteLevel" in json.dumps(state.get("pre_tokenizer")):
            vocab = tokenizer.get_vocab()
            lost = frozenset(b for b, c in _byte_characters().items() if c not in vocab)
        facts = TokenizerFacts(state["model"]["type"], json.dumps(state["normalizer"]), lost)
        _FACTS[tokenizer] = facts
    return facts


def _normal_form(tokenizer) -> str | None:
    """The composing normal form of the tokenizer's normaliser (NFKC, NFC), or None."""
    normalizer = facts_of(tokenizer).normalizer
    return "NFKC" if "NFKC" in normalizer else "NFC" if "NFC" in normalizer else None


def _is_wordpiece(tokenizer) -> bool:
    return facts_of(tokenizer).model == "WordPiece"


@functools.cache
def _byte_characters() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the character that stands for each byte in the vocabulary."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + k) for k, b in enumerate(others)}}


def bytes_not_in_vocabulary(tokenizer) -> frozenset[int]:
    """The bytes a byte-level BPE vocabulary has no token for (its tokenizer drops them silently);
    empty for other tokenizers (SentencePiece-style byte fallback has all 256)."""
    return facts_of(tokenizer).lost_bytes


def check_stack(encoder, stack, text: str, text_pair: str | None = None) -> None:
    """The invariants of one extracted input, for the encoder's kind of tokenizer."""
    wordpiece = _is_wordpiece(encoder.tokenizer)
    if not wordpiece:  # byte-level BPE, SentencePiece BPE or Unigram: decoders', T5's, ModernBERT's…
        special, unknown = set(encoder.tokenizer.all_special_tokens), encoder.tokenizer.unk_token
        spell, lost = _spelled_decoder(encoder.tokenizer), bytes_not_in_vocabulary(encoder.tokenizer)
    else:
        special, unknown, spell, lost = {"[CLS]", "[SEP]"}, "[UNK]", _spelled_bert, frozenset()
    n = len(stack.tokens)
    assert stack.hidden.shape[:2] == (len(stack.layers), n), (stack.hidden.shape, n)
    assert stack.offsets.shape == (n, 2) and len(stack.word_ids) == n and len(stack.segment_ids) == n
    assert np.isfinite(stack.hidden).all()
    previous = {0: -1, 1: -1}
    form = None if wordpiece else _normal_form(encoder.tokenizer)
    # runs of tokens whose spans overlap, or fall on the marks composition folds into a run's last
    # character: (segment, start, end, tokens)
    runs: list[tuple[int, int, int, list[str]]] = []
    for token, (start, end), word, segment in zip(
        stack.tokens, stack.offsets.tolist(), stack.word_ids.tolist(), stack.segment_ids.tolist(), strict=True
    ):
        if word < 0:
            assert token in special and (start, end) == (0, 0), (token, start, end)
            continue
        source = text if segment == 0 else text_pair
        assert source is not None, "a token of segment 1 without a second text"
        assert word >= previous[segment], "word ids go back within a segment"
        previous[segment] = word
        if start == end and not wordpiece:  # a lone space marker, its span trimmed (GPT-NeoX's trim_offsets)
            assert (
                0 <= start <= len(source) and not encoder.tokenizer.convert_tokens_to_string([token]).strip()
            )
            continue
        assert 0 <= start < end <= len(source), (token, start, end, len(source))
        same = bool(runs) and runs[-1][0] == segment
        reach = 0 if not same else runs[-1][2] if form is None else _marks_end(source, *runs[-1][1:3], form)
        if same and start < reach:  # one character's tokens
            runs[-1] = (segment, runs[-1][1], max(end, runs[-1][2]), [*runs[-1][3], token])
        else:
            runs.append((segment, start, end, [token]))
    # one character can give several tokens (NFD splits a Hangul syllable into its jamo, byte-level
    # BPE an emoji into its bytes, the first merged with the space before it: " \x80" is "ĠÂ" over
    # both characters, then "Ģ" over the second): together, the tokens of a run spell its characters
    for k, (segment, start, end, pieces) in enumerate(runs):
        source = text if segment == 0 else text_pair
        assert source is not None
        if unknown in pieces or lost.intersection(source.encode("utf-8")):
            # a byte-level vocabulary without some bytes (SmolLM2's lacks 0x04, 0x16, 0xF1: the lead
            # byte of U+40000..U+7FFFF, ...) drops them silently (tokenizers' BPE with no unk
            # token), and the offsets of later tokens of that word shift onto the dropped character
            continue
        marks_end = end if form is None else _marks_end(source, start, end, form)
        spelled, expected = spell(pieces, source[start:marks_end])
        last_of_segment = k + 1 == len(runs) or runs[k + 1][0] != segment
        cut = stack.truncated and last_of_segment  # truncation may cut between a character's tokens
        if not cut and not spelled:  # a lone space marker ("▁" before "**") has the next character's span
            assert not wordpiece, (pieces, source[start:end])
            continue
        if not _spells(spelled, expected, cut) and form is not None:  # a mark reordered in from before
            expected = spell(pieces, _marks_before(source, start, form) + source[start:marks_end])[1]
        assert _spells(spelled, expected, cut), (pieces, source[start:end])


def check_text(encoder, text: str, text_pair: str | None = None) -> None:
    """Truncating and windowed extraction of one text (or pair)."""
    pairs = None if text_pair is None else [text_pair]
    if not encoder.tokenizer(text)["input_ids"]:  # no BOS, and an empty text (or bytes it drops)
        with pytest.raises(InputError, match=r"input 0 \(.*\) gives no tokens"):
            encoder.extract([text])
        return
    stack = encoder.extract([text], text_pairs=pairs)[0]
    check_stack(encoder, stack, text, text_pair)
    if text_pair is None:
        windowed = encoder.extract([text], long_texts="window")[0]
        check_stack(encoder, windowed, text)
        if not stack.truncated:  # it fits: windows must change nothing
            assert windowed.n_windows == 1 and windowed.tokens == stack.tokens
            np.testing.assert_array_equal(windowed.hidden, stack.hidden)
        else:  # windows keep every token the truncation cut; special tokens close both
            tail = len(stack.tokens) - int(np.flatnonzero(stack.word_ids >= 0)[-1]) - 1
            kept = len(stack.tokens) - tail
            assert len(windowed.tokens) > len(stack.tokens)
            assert windowed.tokens[:kept] == stack.tokens[:kept]
            assert windowed.tokens[len(windowed.tokens) - tail :] == stack.tokens[kept:]


def check_words(encoder, word_list: list[str]) -> None:
    """Pre-split words: offsets into the joined text, and one vector per input word."""
    if not encoder.tokenizer(word_list, is_split_into_words=True)["input_ids"]:  # as check_text
        for call in (encoder.extract, encoder.embed_words):
            with pytest.raises(InputError, match=r"input 0 \(.*\) gives no tokens"):
                call(words=[word_list])
        return
    stack = encoder.extract(words=[word_list])[0]
    check_stack(encoder, stack, " ".join(word_list))
    assert stack.words == tuple(word_list)
    for long_texts in ("truncate", "window"):
        vectors = encoder.embed_words(words=[word_list], layers=-1, long_texts=long_texts)[0]
        if long_texts == "window":
            assert vectors.words_lost == 0
        # one vector per input word; truncation cuts off whole trailing words, counted in words_lost
        kept = len(word_list) - vectors.words_lost
        assert vectors.vectors.shape[-2] == kept and vectors.words == tuple(word_list[:kept])
        have_pieces = set(stack.word_ids.tolist()) - {-1} if long_texts == "truncate" else None
        for w in range(kept):
            if w in vectors.words_empty:
                assert not vectors.vectors[..., w, :].any()
            else:
                assert have_pieces is None or w in have_pieces
        if vectors.words_lost:
            assert stack.truncated
