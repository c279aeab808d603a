"""Known answers for sentence and word pooling on small hand-made stacks."""

import numpy as np
import pytest

import layerwise as lw
from layerwise._engine.engine import LayerStack
from layerwise.errors import OptionError


def hand_stack() -> LayerStack:
    # [CLS] un ##believ ##able day [SEP]: 2 layers, hidden size 2
    hidden = np.array(
        [
            [[1, 0], [2, 4], [4, 0], [0, 8], [3, 3], [5, 5]],
            [[0, 1], [1, 1], [1, 3], [1, 5], [6, 0], [2, 2]],
        ],
        dtype=np.float32,
    )
    return LayerStack(
        hidden=hidden,
        layers=(5, 6),
        tokens=("[CLS]", "un", "##believ", "##able", "day", "[SEP]"),
        offsets=np.array([[0, 0], [0, 2], [2, 8], [8, 12], [13, 16], [0, 0]], dtype=np.int32),
        word_ids=np.array([-1, 0, 0, 0, 1, -1], dtype=np.int32),
        segment_ids=np.zeros(6, dtype=np.int8),
        text="unbelievable day",
    )


def test_sentence_pools_known_answers():
    s = hand_stack()
    np.testing.assert_array_equal(lw.pool_sentence(s, "cls"), [[1, 0], [0, 1]])
    np.testing.assert_allclose(lw.pool_sentence(s, "mean"), [[15 / 6, 20 / 6], [11 / 6, 12 / 6]])
    np.testing.assert_allclose(lw.pool_sentence(s, "mean", "exclude"), [[9 / 4, 15 / 4], [9 / 4, 9 / 4]])
    np.testing.assert_array_equal(lw.pool_sentence(s, "max"), [[5, 8], [6, 5]])
    np.testing.assert_array_equal(lw.pool_sentence(s, "max", "exclude"), [[4, 8], [6, 5]])
    np.testing.assert_array_equal(lw.pool_sentence(s, "cls", "exclude"), [[1, 0], [0, 1]])


def test_word_pools_known_answers():
    s = hand_stack()
    first = lw.pool_words(s, "first")
    assert first.words == ("unbelievable", "day")
    assert first.spans.tolist() == [[0, 12], [13, 16]]
    assert first.n_subwords.tolist() == [3, 1]
    np.testing.assert_array_equal(first.vectors, [[[2, 4], [3, 3]], [[1, 1], [6, 0]]])
    np.testing.assert_array_equal(lw.pool_words(s, "last").vectors, [[[0, 8], [3, 3]], [[1, 5], [6, 0]]])
    np.testing.assert_allclose(lw.pool_words(s, "mean").vectors, [[[2, 4], [3, 3]], [[1, 3], [6, 0]]])
    np.testing.assert_array_equal(lw.pool_words(s, "max").vectors, [[[4, 8], [3, 3]], [[1, 5], [6, 0]]])
    np.testing.assert_array_equal(
        lw.pool_words(s, "first_last").vectors, [[[2, 4, 0, 8], [3, 3, 3, 3]], [[1, 1, 1, 5], [6, 0, 6, 0]]]
    )


def test_bad_pool_names():
    with pytest.raises(OptionError, match="pool='avg' is not valid; choose one of 'cls', 'mean', 'max'"):
        lw.pool_sentence(hand_stack(), "avg")
    with pytest.raises(OptionError, match="subword='middle'"):
        lw.pool_words(hand_stack(), "middle")


def test_empty_text_exclude_falls_back_to_special_tokens(tiny_encoder):
    stack = tiny_encoder.extract([""])[0]
    np.testing.assert_allclose(
        lw.pool_sentence(stack, "mean", "exclude"), stack.hidden.mean(axis=1), rtol=1e-6
    )


TRICKY = [
    ("well-known", ["well", "-", "known"]),
    ("don't", ["don", "'", "t"]),
    ("café", ["café"]),
    ("naïve résumé", ["naïve", "résumé"]),
    ("I ❤ 東京", ["I", "❤", "東", "京"]),
    ("1,000,000.50 dollars", ["1", ",", "000", ",", "000", ".", "50", "dollars"]),
    ("antidisestablishmentarianism", ["antidisestablishmentarianism"]),
]


@pytest.mark.parametrize(("text", "expected"), TRICKY)
def test_raw_text_words_follow_offsets(tiny_encoder, text, expected):
    wv = tiny_encoder.embed_words([text], subword="mean")[0]
    assert list(wv.words) == expected
    for word, (s, e) in zip(wv.words, wv.spans.tolist(), strict=True):
        assert text[s:e] == word


def test_pre_split_words_align_to_callers_words(tiny_encoder):
    words = [
        "Dr.",
        "Smith-Jones",
        "didn't",
        "pay",
        "$1,000.50",
        "for",
        "antidisestablishmentarianism",
        "🙂",
        "東京",
    ]
    wv = tiny_encoder.embed_words([words], subword="first")[0]
    assert list(wv.words) == words
    assert wv.vectors.shape == (4, len(words), 32)
    assert wv.n_subwords[6] >= 5  # one word, many wordpieces
    stack = tiny_encoder.extract(words=[words])[0]
    for j in range(len(words)):
        tokens = np.flatnonzero(stack.word_ids == j)
        np.testing.assert_array_equal(wv.vectors[:, j], stack.hidden[:, tokens[0]])
        s, e = wv.spans[j]
        assert stack.text[s:e] == words[j]


def test_pairs_keep_per_segment_words(tiny_encoder):
    wv = tiny_encoder.embed_words(pairs=[("Is it raining?", "Yes, it is.")])[0]
    assert wv.words == ("Is", "it", "raining", "?", "Yes", ",", "it", "is", ".")
    assert wv.segment_ids.tolist() == [0] * 4 + [1] * 5
    s, e = wv.spans[4]
    assert wv.text_pair[s:e] == "Yes"


def test_word_lost_to_truncation_is_reported_not_shifted(make_tiny_model):
    enc = lw.Encoder(make_tiny_model("bert"), device="cpu", max_length=8)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota"]
    wv = enc.embed_words([words])[0]
    kept = wv.n_words
    assert kept < len(words) and wv.words_lost == len(words) - kept
    assert list(wv.words) == words[:kept]  # a prefix: nothing shifted onto the wrong word
    windowed = enc.embed_words([words], long_texts="window")[0]
    assert list(windowed.words) == words and windowed.words_lost == 0


def test_words_without_wordpieces_keep_their_slot(default_encoder, caplog):
    """0.1 returned 3 vectors for these 5 words, silently shifting every later label."""
    import logging

    import layerwise as lw

    words = ["a", "\u200b", "b", "\u00ad", "c"]
    with caplog.at_level(logging.WARNING, logger="layerwise"):
        result = default_encoder.embed_words([words, ["plain", "words"]], subword="mean")
    first = result[0]
    assert first.words == tuple(words) and first.vectors.shape == (7, 5, 384)
    assert first.words_empty == (1, 3) and first.n_subwords.tolist() == [1, 0, 1, 0, 1]
    assert not first.vectors[:, [1, 3]].any()
    exact = default_encoder.embed_words([["a", "b", "c"]], subword="mean")[0]
    np.testing.assert_allclose(first.vectors[:, [0, 2, 4]], exact.vectors, atol=1e-5)
    assert first.spans.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert result[1].words_empty == ()
    notes = [r.getMessage() for r in caplog.records if "produced no token" in r.getMessage()]
    assert len(notes) == 1 and notes[0].startswith("2 words in 1 inputs produced no token")
    fused = default_encoder.embed_words([words], fuse="concat_last4")[0]
    assert (
        fused.vectors.shape == (5, 4 * 384) and fused.fuse == "concat_last4" and fused.layers == (3, 4, 5, 6)
    )
    assert isinstance(first, lw.WordVectors)


def test_every_front_end_lists_the_pools_and_fusions_of_names_py():
    # one list each (features/names.py): the CLI's help, the server's schema and the checks read it
    from typer.main import get_command

    from layerwise._features.names import FUSIONS, SENTENCE_POOLS, SUBWORD_POOLS, pool_names
    from layerwise.cli import app
    from layerwise.serve._schemas import LayersRequest

    for command in ("extract", "export"):  # the plan's option group, as each command shows it
        options = {p.name: p for p in get_command(app).commands[command].params}  # type: ignore[attr-defined]
        pool_help = options["pool"].help
        assert pool_help == LayersRequest.model_fields["pool"].description
        assert pool_help.endswith("sentence:" + "|".join(SENTENCE_POOLS))
        assert "word:" + "|".join(SUBWORD_POOLS) in pool_help
        assert all(name in options["fuse"].help for name in FUSIONS)
    assert len(pool_names()) == 1 + len(SUBWORD_POOLS) + len(SENTENCE_POOLS)
    with pytest.raises(OptionError, match="layerwise implements cls, mean, max, last"):
        from layerwise._features.names import sentence_convention

        sentence_convention(type("ST", (), {"pool": "weightedmean", "normalize": False})())
