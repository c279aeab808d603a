"""The columnar path: tokenised blocks as arrays (inputs/block.py), batches as gathers of them, and
``embed`` / ``embed_words`` / ``extract`` from whole batches (encoder/batch_results.py), each held to
an independent computation: the fast tokenizer's own per-input encodings, the per-input path
(``Engine.stream``, which windows, taps and the server use), and loops written out here."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
from conftest import corpus, ud_sentences
from tokenizers import Tokenizer

import layerwise as lw
from layerwise._encoder.calls import blocks_ahead
from layerwise._features.device_pool import sentence_owner, word_owner
from layerwise._features.pool import word_group_keys
from layerwise._inputs.batches import length_sorted_batches
from layerwise._inputs.block import TokenColumns, gather_index
from layerwise._inputs.raw import normalize_inputs

LONG = " ".join(corpus(30, seed=9))  # past every tiny model's maximum
WORDS = [["We", "sat", "on", "the", "bank", "."], ["\u200b", "ok", "x\u00ad"], LONG.split()[:200], ["a"]]


@pytest.fixture(scope="module")
def enc(make_tiny_model):
    return lw.Encoder(make_tiny_model("bert"), device="cpu", max_length=32)


def _fitting(enc, texts: list[str]) -> list[str]:
    """The texts that need no window (the per-input path is reached with long_texts="window")."""
    return [t for t, item in zip(texts, enc.tokenize(texts), strict=True) if not item.truncated]


def _free_tokenizer(enc) -> Tokenizer:
    free = Tokenizer.from_str(enc.tokenizer.backend_tokenizer.to_str())
    free.no_padding()
    free.no_truncation()
    free.encode_special_tokens = True
    return free


def test_block_columns_equal_the_tokenizers_own_encodings(enc):
    texts = [*ud_sentences(limit=30), LONG, "Ünïcödé 😀 [SEP] x", ""]
    pairs = ud_sentences(limit=len(texts))[::-1]
    for raw in (
        normalize_inputs(texts),
        normalize_inputs(texts, text_pairs=pairs),
        normalize_inputs(words=WORDS),
    ):
        block = enc.inputs.encode_block(raw)
        items = enc.inputs.encode(raw)
        assert len(block) == len(items)
        for i, item in enumerate(items):  # the per-input view is the tokenizer's encoding, cut
            lo, hi = block.bounds[i], block.bounds[i + 1]
            assert block.ids[lo:hi].tolist() == list(item.ids)
            assert block.type_ids[lo:hi].tolist() == list(item.type_ids)
            assert block.word_ids[lo:hi].tolist() == [-1 if w is None else w for w in item.word_ids]
            assert block.offsets[lo:hi].tolist() == [list(o) for o in item.offsets]
            assert block.tokens(i) == item.tokens
            # segments: a special token takes the segment of the content token before it, else 0
            expected, current = [], 0
            for s in item.sequence_ids:
                current = s if s is not None else current
                expected.append(current)
            assert block.segments[lo:hi].tolist() == expected


def test_one_truncating_call_counts_what_a_whole_tokenisation_counts(enc):
    """Single texts are tokenised once, cut; a cut text's overflowing pieces give its full length
    and the words it lost, as the whole text tokenised apart gives them."""
    free = _free_tokenizer(enc)
    texts = [LONG[:2000], LONG[:700], "short", " ".join(corpus(8, seed=2)), LONG]
    for detailed in (True, False):
        block = enc.inputs.encode_block(normalize_inputs(texts), detailed=detailed)
        assert block.counts_exact.tolist() == [True] * 4 + [False]  # LONG: only a prefix is tokenised
        assert block.n_untruncated[4] < len(free.encode(LONG))  # "at least"
        for i, text in enumerate(texts[:4]):
            whole = free.encode(text)
            kept = block.lengths[i]
            assert block.n_untruncated[i] == len(whole)
            assert bool(block.truncated[i]) == (len(whole) > enc.max_length)
            if block.truncated[i]:
                cut = [w for w in whole.word_ids[: kept - 1] if w is not None]
                assert block.words_lost[i] == len({w for w in whole.word_ids if w is not None} - set(cut))
        assert block.ids.tolist() == enc.inputs.encode_block(normalize_inputs(texts)).ids.tolist()
    lean = enc.inputs.encode_block(normalize_inputs(texts), detailed=False)
    with pytest.raises(AssertionError, match="without offsets"):
        _ = lean.offsets


def test_tokens_from_the_vocabulary_equal_the_encodings_tokens_or_fall_back(enc):
    raw = normalize_inputs(["Ünïcödé déjà-vu 😀 naïve [UNK] x", *ud_sentences(limit=20)])
    block = enc.inputs.encode_block(raw)
    assert enc.inputs.vocabulary is not None
    assert [block.tokens(i) for i in range(len(block))] == [tuple(e.tokens) for e in block.encodings]
    enc.inputs.__dict__["vocabulary"] = None  # a vocabulary the probe refused: each encoding's own tokens
    try:
        again = enc.inputs.encode_block(raw)
        assert [again.tokens(i) for i in range(len(again))] == [tuple(e.tokens) for e in again.encodings]
    finally:
        del enc.inputs.__dict__["vocabulary"]


def test_a_gather_of_columns_is_the_inputs_back_to_back(enc):
    block = enc.inputs.encode_block(normalize_inputs(ud_sentences(limit=40)))
    rows = np.asarray([7, 3, 39, 0, 12])
    columns = block.columns(rows)
    assert columns.lengths == [len(block.encodings[r]) for r in rows]
    assert columns.ids.tolist() == [t for r in rows for t in block.encodings[r].ids]
    index = gather_index(block.starts, block.lengths, rows)
    assert columns.word_ids.tolist() == block.word_ids[index].tolist()
    units = TokenColumns.of_units([block.item(int(r)) for r in rows])  # the per-input objects' way
    assert units.ids.tolist() == columns.ids.tolist()
    assert units.word_ids.tolist() == columns.word_ids.tolist()
    assert units.segments.tolist() == columns.segments.tolist()


def test_word_owner_numbers_words_as_each_inputs_own_groups_do():
    rng = random.Random(0)
    for _ in range(200):
        parts = []
        for _ in range(rng.randint(1, 6)):
            n = rng.randint(1, 12)
            words = [rng.choice([-1, rng.randint(0, 5)]) for _ in range(n)]  # not monotone: any order
            segments = sorted(rng.randint(0, 1) for _ in range(n))
            parts.append((np.asarray(segments, np.int8), np.asarray(words, np.int32)))
        columns = TokenColumns([len(w) for _, w in parts], np.zeros(sum(len(w) for _, w in parts), np.int64),
                               word_ids=np.concatenate([w for _, w in parts]),
                               segments=np.concatenate([s for s, _ in parts]))  # fmt: skip
        owner, counts = word_owner(columns)
        expected, offset = [], 0
        for segments, words in parts:
            group, keys = word_group_keys(segments, words)  # the per-input numbering, a loop per token
            expected.append(np.where(group >= 0, group + offset, -1))
            offset += len(keys)
        assert counts == [len(word_group_keys(s, w)[1]) for s, w in parts]
        assert owner.tolist() == np.concatenate(expected).tolist()
        # a sentence's owner: every token its input's; with exclude, special tokens out unless all are
        own = sentence_owner(columns, "exclude", "mean")
        for b, (start, (_, words)) in enumerate(zip(columns.starts, parts, strict=True)):
            mine = own[start : start + len(words)]
            want = [b if (w >= 0 or (words < 0).all()) else -1 for w in words]
            assert mine.tolist() == want


def test_packed_batches_by_search_equal_the_loop_over_items():
    rng = random.Random(1)
    for _ in range(500):
        lengths = [rng.randint(1, 300) for _ in range(rng.randint(0, 60))]
        size, budget = rng.randint(1, 20), rng.choice([None, rng.randint(1, 900)])
        order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
        want, current, tokens = [], [], 0
        for i in order:
            if current and (len(current) >= size or (budget is not None and tokens + lengths[i] > budget)):
                want.append(current)
                current, tokens = [], 0
            current.append(i)
            tokens += lengths[i]
        want += [current] if current else []
        assert length_sorted_batches(lengths, size, budget, padded=False) == want


@pytest.mark.parametrize("special_tokens", ["include", "exclude"])
@pytest.mark.parametrize("pool", ["mean", "cls", "max", "last"])
def test_embed_from_batches_equals_the_per_input_path(enc, pool, special_tokens):
    """The block path against the per-input one (windows mode runs it; no text here needs a window)."""
    texts = _fitting(enc, [*ud_sentences(limit=80), "x"])
    assert len(texts) > 40
    got = enc.embed(texts, layers="all", pool=pool, special_tokens=special_tokens)
    want = enc.embed(texts, layers="all", pool=pool, special_tokens=special_tokens, long_texts="window")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    options = dict(fuse="concat_last4", pool=pool, special_tokens=special_tokens, normalize=True)
    fused = enc.embed(texts, **options)
    np.testing.assert_allclose(fused, enc.embed(texts, **options, long_texts="window"), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("subword", ["first", "last", "mean", "max", "first_last"])
def test_embed_words_from_batches_equal_the_per_input_path(enc, subword):
    short_words = [w[:20] for w in WORDS]
    for inputs in (_fitting(enc, ud_sentences(limit=50)), short_words):
        got = enc.embed_words(inputs, subword=subword, layers=[0, -1])
        want = enc.embed_words(inputs, subword=subword, layers=[0, -1], long_texts="window")
        for g, w in zip(got, want, strict=True):
            for field in ("words", "layers", "text", "text_pair", "words_lost", "words_empty", "fuse"):
                assert getattr(g, field) == getattr(w, field)
            for field in ("spans", "segment_ids", "n_subwords"):
                assert getattr(g, field).tolist() == getattr(w, field).tolist()
            np.testing.assert_allclose(g.vectors, w.vectors, rtol=1e-5, atol=1e-6)
    pairs = enc.embed_words(ud_sentences(limit=8), text_pairs=ud_sentences(limit=16)[8:], fuse="mean_all")
    alone = [enc.embed_words([a], text_pairs=[b], fuse="mean_all")[0] for a, b in
             zip(ud_sentences(limit=8), ud_sentences(limit=16)[8:], strict=True)]  # fmt: skip
    for g, w in zip(pairs, alone, strict=True):
        assert g.words == w.words and g.segment_ids.tolist() == w.segment_ids.tolist()
        np.testing.assert_allclose(g.vectors, w.vectors, rtol=1e-5, atol=1e-6)


def test_extract_from_batches_equals_one_input_at_a_time(enc):
    texts = [*ud_sentences(limit=25), LONG]
    stacks = enc.extract(texts, layers=[0, 2, -1], dtype="float16")
    for text, stack in zip(texts, stacks, strict=True):
        alone = enc.extract(text, layers=[0, 2, -1])
        assert stack.tokens == alone.tokens and stack.truncated == alone.truncated
        for field in ("offsets", "word_ids", "segment_ids"):
            assert getattr(stack, field).tolist() == getattr(alone, field).tolist()
        assert stack.hidden.dtype == np.float16
        np.testing.assert_allclose(stack.hidden, alone.hidden.astype(np.float16), rtol=2e-3, atol=2e-3)


def test_blocks_on_a_thread_give_the_blocks_in_line_and_one_warning(enc, caplog, monkeypatch):
    """A GPU's path (the next block tokenised on a thread) and a CPU's (in line): the same blocks,
    the truncation counted over all of them, once."""
    texts = [*ud_sentences(limit=50), LONG, *ud_sentences(limit=30), LONG]
    raw = normalize_inputs(texts)
    monkeypatch.setattr(type(enc), "batch_size", property(lambda self: 4))  # a property
    monkeypatch.setattr("layerwise._encoder.calls.MAX_BLOCK", 4)
    with caplog.at_level(logging.WARNING, logger="layerwise"):
        in_line = list(blocks_ahead(enc, raw, True))

        class Cuda:
            type = "cuda"

        monkeypatch.setattr(type(enc), "device", property(lambda self: Cuda()))
        beside = list(blocks_ahead(enc, raw, True))
    assert [b.first for b in beside] == [0, 4, 20, 36, 52, 68]  # one batch, then 4x more, up to 16
    assert [b.first for b in in_line] == list(range(0, len(texts), 16))
    ids = np.concatenate([b.ids for b in beside])
    assert ids.tolist() == np.concatenate([b.ids for b in in_line]).tolist()
    warnings = [r.getMessage() for r in caplog.records if "truncated" in r.getMessage()]
    free = _free_tokenizer(enc)
    cut = sum(len(free.encode(t)) > enc.max_length for t in texts)
    assert len(warnings) == 2 and warnings[0] == warnings[1]  # once a call, the same on both paths
    assert warnings[0].startswith(f"{cut} of {len(texts)} inputs were longer than 32 tokens")


def test_an_error_in_a_later_block_comes_after_the_results_before_it(enc, monkeypatch):
    monkeypatch.setattr(type(enc), "batch_size", property(lambda self: 4))  # a property
    monkeypatch.setattr("layerwise._encoder.calls.MAX_BLOCK", 4)  # blocks of 16 inputs
    real = enc.inputs.encode_block

    def failing(raw, **options):
        if options.get("first", 0) >= 16:
            raise lw.InputError("block two is bad")
        return real(raw, **options)

    monkeypatch.setattr(enc.inputs, "encode_block", failing)
    stream = enc.iter_extract(ud_sentences(limit=40), layers=-1)  # the first block is tokenised here
    seen = []
    with pytest.raises(lw.InputError, match="block two"):
        for index, _ in stream:
            seen.append(index)
    assert sorted(seen) == list(range(16))
