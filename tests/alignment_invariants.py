"""Alignment invariants over arbitrary Unicode input, shared by the hypothesis tests
(tests/test_fuzz_alignment.py, a few hundred examples) and benchmarks/fuzz_alignment.py (10,000).

Each ``check_*`` function takes an Encoder and one generated input and asserts what must hold for
every input: one hidden row per token at every layer, offsets inside the text pointing at the
characters the token came from, word ids monotone within a segment, one word vector per input
word, windowed results equal to unwindowed ones for inputs that fit.
"""

from __future__ import annotations

import unicodedata

import numpy as np
from hypothesis import strategies as st

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


def check_stack(stack, text: str, text_pair: str | None = None, special=("[CLS]", "[SEP]")) -> None:
    n = len(stack.tokens)
    assert stack.hidden.shape[:2] == (len(stack.layers), n), (stack.hidden.shape, n)
    assert stack.offsets.shape == (n, 2) and len(stack.word_ids) == n and len(stack.segment_ids) == n
    assert np.isfinite(stack.hidden).all()
    previous = {0: -1, 1: -1}
    runs: list[tuple[int, int, int, str]] = []  # runs of tokens with one span: (segment, start, end, text)
    for token, (start, end), word, segment in zip(
        stack.tokens, stack.offsets.tolist(), stack.word_ids.tolist(), stack.segment_ids.tolist(), strict=True
    ):
        if word < 0:
            assert token in special and (start, end) == (0, 0), (token, start, end)
            continue
        source = text if segment == 0 else text_pair
        assert source is not None, "a token of segment 1 without a second text"
        assert 0 <= start < end <= len(source), (token, start, end, len(source))
        assert word >= previous[segment], "word ids go back within a segment"
        previous[segment] = word
        piece = "\0" if token == "[UNK]" else token.removeprefix("##")
        if runs and runs[-1][:3] == (segment, start, end):
            runs[-1] = (segment, start, end, runs[-1][3] + piece)
        else:
            runs.append((segment, start, end, piece))
    # one character can give several tokens (NFD splits a Hangul syllable into its jamo): together,
    # the tokens of one span spell the normalised characters of that span
    for k, (segment, start, end, pieces) in enumerate(runs):
        if "\0" in pieces:
            continue
        source = text if segment == 0 else text_pair
        expected = _bert_normalise(source[start:end])
        last_of_segment = k + 1 == len(runs) or runs[k + 1][0] != segment
        if stack.truncated and last_of_segment:  # truncation may cut between a character's tokens
            assert expected.startswith(pieces), (pieces, source[start:end])
        else:
            assert expected == pieces, (pieces, source[start:end])


def check_text(encoder, text: str, text_pair: str | None = None) -> None:
    """Truncating and windowed extraction of one text (or pair)."""
    pairs = None if text_pair is None else [text_pair]
    stack = encoder.extract([text], text_pairs=pairs)[0]
    check_stack(stack, text, text_pair)
    if text_pair is None:
        windowed = encoder.extract([text], long_texts="window")[0]
        check_stack(windowed, text)
        if not stack.truncated:  # it fits: windows must change nothing
            assert windowed.n_windows == 1 and windowed.tokens == stack.tokens
            np.testing.assert_array_equal(windowed.hidden, stack.hidden)
        else:  # windows keep every token the truncation cut
            assert len(windowed.tokens) > len(stack.tokens)
            assert windowed.tokens[: len(stack.tokens) - 1] == stack.tokens[:-1]


def check_words(encoder, word_list: list[str]) -> None:
    """Pre-split words: offsets into the joined text, and one vector per input word."""
    stack = encoder.extract(words=[word_list])[0]
    check_stack(stack, " ".join(word_list))
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
