"""Input hygiene: every odd input gets a result or an error that names it and the fix."""

import logging

import numpy as np
import pytest

from layerwise._inputs.batches import length_sorted_batches
from layerwise._inputs.raw import normalize_inputs
from layerwise.errors import InputError, OptionError


def test_empty_and_whitespace_texts_give_special_tokens_only(tiny_encoder):
    empty, blank, real = tiny_encoder.extract(["", "   \t ", "ok"])
    for stack in (empty, blank):
        assert stack.tokens == ("[CLS]", "[SEP]")
        assert stack.hidden.shape == (4, 2, 32)
        assert stack.word_ids.tolist() == [-1, -1]
    assert real.tokens == ("[CLS]", "ok", "[SEP]")


def test_control_characters_and_nul_are_cleaned_not_fatal(tiny_encoder):
    text = "a\x00b c\x07d\te\u200bf"
    stack = tiny_encoder.extract([text])[0]
    assert stack.text == text  # the caller's text is kept as given
    assert "\x00" not in "".join(stack.tokens)
    # BERT's normaliser drops control characters, so "a\x00b" is one word "ab" spanning 0..3
    assert stack.tokens[1] == "ab"
    assert stack.offsets[1].tolist() == [0, 3]
    assert np.isfinite(stack.hidden).all()


def test_emoji_and_cjk_offsets_point_at_the_characters(tiny_encoder):
    text = "I ❤ 東京 🙂!"
    stack = tiny_encoder.extract([text])[0]
    spans = {tok: text[s:e] for tok, (s, e) in zip(stack.tokens, stack.offsets.tolist(), strict=True)}
    # CJK characters become one token each; the emoji is unknown to the vocabulary
    assert spans["東"] == "東" and spans["京"] == "京"
    unknown = [
        text[s:e] for tok, (s, e) in zip(stack.tokens, stack.offsets.tolist(), strict=True) if tok == "[UNK]"
    ]
    assert "🙂" in unknown


def test_long_text_is_truncated_flagged_and_reported(make_tiny_model, caplog):
    import layerwise as lw

    enc = lw.Encoder(make_tiny_model("bert"), device="cpu", max_length=16)
    long_text = " ".join(["word"] * 40)
    with caplog.at_level(logging.WARNING, logger="layerwise"):
        short, long = enc.extract(["short text", long_text])
    assert not short.truncated
    assert long.truncated and long.n_tokens == 16 and long.tokens[-1] == "[SEP]"
    assert (
        "1 of 2 inputs were longer than 16 tokens and were truncated (first: input 1, 42 tokens; "
        "26 words lost in all)" in caplog.text
    )
    assert long.words_lost == 26  # 40 words, 14 kept between [CLS] and [SEP]


def test_long_pair_is_truncated_longest_first(make_tiny_model):
    import layerwise as lw

    enc = lw.Encoder(make_tiny_model("bert"), device="cpu", max_length=12)
    stack = enc.extract(pairs=[("a b", " ".join(["x"] * 30))])[0]
    assert stack.truncated and stack.n_tokens == 12
    assert stack.tokens[:4] == ("[CLS]", "a", "b", "[SEP]")  # the short segment survives
    assert stack.segment_ids.tolist() == [0] * 4 + [1] * 8


def test_max_length_beyond_model_is_refused(make_tiny_model):
    import layerwise as lw

    with pytest.raises(OptionError, match="max_length=4096 must be between 2 and this model's maximum, 128"):
        lw.Encoder(make_tiny_model("bert"), device="cpu", max_length=4096)


def test_pair_lists_of_different_lengths():
    with pytest.raises(InputError, match="texts has 3 items but text_pairs has 2; pass exactly one second"):
        normalize_inputs(["a", "b", "c"], text_pairs=["x", "y"])


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"pairs": [("a", "b"), ("only one",)]}, r"pairs\[1\] must be a \(first, second\) tuple"),
        ({"pairs": [("a", "b", "c")]}, "3 items"),
        ({"pairs": [("a", None)]}, r"pairs\[0\]\[1\] is NoneType"),
        ({"texts": ["ok", 3]}, r"texts\[1\] is int"),
        ({"texts": "a single string"}, "wrap a single text in a list"),
        ({"words": [["ok", ""]]}, r"words\[0\]\[1\] is ''"),
        ({"words": ["not split"]}, r"words\[0\] is str"),
        ({}, "pass exactly one of texts=, pairs= or words="),
        ({"texts": ["a"], "pairs": [("a", "b")]}, "got texts, pairs"),
        ({"text_pairs": ["x"]}, "needs texts="),
    ],
)
def test_bad_inputs_name_the_item(kwargs, fragment):
    with pytest.raises(InputError, match=fragment):
        normalize_inputs(**kwargs)


def test_input_error_carries_index():
    with pytest.raises(InputError) as info:
        normalize_inputs(["ok", "fine", None])
    assert info.value.index == 2


def test_pre_split_words_keep_alignment_and_offsets(tiny_encoder):
    words = ["Unbelievably", "long", "antidisestablishmentarianism", "."]
    stack = tiny_encoder.extract(words=[words])[0]
    assert stack.text == " ".join(words)
    for tok, word_id, (s, e) in zip(stack.tokens, stack.word_ids, stack.offsets.tolist(), strict=True):
        if word_id < 0:
            assert tok in ("[CLS]", "[SEP]")
            continue
        piece = stack.text[s:e].lower()
        assert piece == tok.removeprefix("##")
        assert words[word_id].lower().find(piece) >= 0
    assert sorted(set(stack.word_ids.tolist()) - {-1}) == [0, 1, 2, 3]
    assert (stack.word_ids == 2).sum() >= 5  # a word split into 5+ wordpieces


def test_pairs_have_segment_ids_and_per_segment_offsets(tiny_encoder):
    stack = tiny_encoder.extract(pairs=[("Is it raining?", "Yes, it is.")])[0]
    assert stack.tokens == (
        "[CLS]",
        "is",
        "it",
        "raining",
        "?",
        "[SEP]",
        "yes",
        ",",
        "it",
        "is",
        ".",
        "[SEP]",
    )
    assert stack.segment_ids.tolist() == [0] * 6 + [1] * 6
    s, e = stack.offsets[6]
    assert stack.text_pair[s:e] == "Yes"
    assert stack.word_ids.tolist() == [-1, 0, 1, 2, 3, -1, 0, 1, 2, 3, 4, -1]


def test_text_pairs_equal_pairs(tiny_encoder):
    a = tiny_encoder.extract(["Is it raining?"], text_pairs=["Yes."])[0]
    b = tiny_encoder.extract(pairs=[("Is it raining?", "Yes.")])[0]
    np.testing.assert_array_equal(a.hidden, b.hidden)


def test_batches_sorted_longest_first_and_cover_all():
    lengths = [3, 9, 1, 9, 5]
    batches = length_sorted_batches(lengths, 2)
    assert batches == [[1, 3], [4, 0], [2]]
    with pytest.raises(OptionError, match="batch_size=0"):
        length_sorted_batches(lengths, 0)


def test_batches_respect_a_padded_token_budget():
    lengths = [500, 20, 20, 20, 20, 300, 300, 19]
    batches = length_sorted_batches(lengths, batch_size=100, max_tokens=64)
    # an item over the budget rides alone; the others fill up to 64 padded tokens
    assert batches == [[0], [5], [6], [1, 2, 3], [4, 7]]
    for batch in batches:
        assert len(batch) == 1 or max(lengths[i] for i in batch) * len(batch) <= 64
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    with pytest.raises(OptionError, match="max_tokens=0"):
        length_sorted_batches(lengths, 4, max_tokens=0)


def test_tokenizer_padding_of_packaged_model_is_off(default_encoder):
    # tokenizer.json of all-MiniLM-L6-v2 pads every input to 128; layerwise must not
    encoded = default_encoder.tokenize(["hello world"])
    assert len(encoded[0]) == 4
    # and the caller's tokenizer is left untouched
    assert default_encoder.tokenizer("hello")["input_ids"] == [101, 7592, 102]


def test_very_long_text_is_truncated_without_tokenising_all_of_it(default_encoder):
    import time

    from tokenizers import Tokenizer

    text = " ".join(f"word{i % 97} bank rates" for i in range(60_000))  # ~900k characters
    started = time.perf_counter()
    item = default_encoder.tokenize([text])[0]
    seconds = time.perf_counter() - started
    reference = Tokenizer.from_str(default_encoder.tokenizer.backend_tokenizer.to_str())
    reference.no_padding()
    reference.enable_truncation(default_encoder.max_length)
    whole = reference.encode(text)
    assert list(item.ids) == whole.ids and [tuple(o) for o in item.offsets] == whole.offsets
    assert item.truncated and not item.counts_exact and item.words_lost > 0
    assert seconds < 1.0, seconds  # whole-text tokenisation of this line takes several seconds


def test_window_mode_refuses_a_text_too_large_to_hold(default_encoder):
    with pytest.raises(InputError, match=r"input 1 has 10,000,000 characters: with long_texts='window'"):
        default_encoder.extract(["ok", "x" * 10_000_000], long_texts="window")


def test_lone_surrogate_is_refused_with_its_position():
    with pytest.raises(InputError, match=r"lone surrogate U\+D800 at character 2") as info:
        normalize_inputs(["fine", "ab\ud800c"])
    assert info.value.index == 1


def test_literal_special_token_text_is_split_as_text(tiny_encoder):
    # "[SEP]" typed by a user is five characters, not a segment boundary
    stack = tiny_encoder.extract(["a [SEP] b"])[0]
    assert stack.tokens.count("[SEP]") == 1 and stack.tokens[-1] == "[SEP]"
    assert stack.tokens.count("[CLS]") == 1
    assert set(stack.segment_ids.tolist()) == {0}
    assert "[" in stack.tokens and "]" in stack.tokens


def test_window_too_small_for_special_tokens_names_the_fix(make_tiny_model):
    import layerwise as lw

    encoder = lw.Encoder(make_tiny_model("bert"), max_length=2)
    with pytest.raises(InputError, match="no room besides its special tokens; use a larger max_length"):
        encoder.extract(["a b c d"], long_texts="window")


def test_a_much_shorter_input_starts_a_new_batch():
    # one document and short sentences: the sentences are not padded to the document's width
    batches = length_sorted_batches([250, 30, 28, 25, 240, 26], batch_size=32, max_tokens=4096)
    assert batches == [[0, 4], [1, 2, 5, 3]]
    # lengths within a quarter of the width (or 16 tokens) share a batch
    assert length_sorted_batches([100, 80, 76, 20, 10], batch_size=32) == [[0, 1, 2], [3, 4]]


def test_any_iterable_of_strings_is_a_list_of_texts(tiny_encoder, tmp_path):
    """pandas and polars Series, pyarrow arrays, NumPy arrays, tuples and generators give the same
    vectors as a list; a null among them is refused by its index."""
    import numpy as np
    import pyarrow as pa

    import layerwise as lw

    texts = ["the bank raised rates", "a river bank", "ok"]
    want = tiny_encoder.embed(texts)
    given = {
        "tuple": tuple(texts),
        "generator": (t for t in texts),
        "numpy": np.asarray(texts),
        "pyarrow": pa.array(texts),
        "chunked": pa.chunked_array([texts[:1], texts[1:]]),
    }
    try:
        import pandas as pd

        given["pandas"] = pd.Series(texts, index=[10, 20, 30])  # not positions 0..2
    except ImportError:
        pass
    for name, values in given.items():
        np.testing.assert_array_equal(tiny_encoder.embed(values), want, err_msg=name)
    features = tiny_encoder.features(pa.array(texts), pools=("mean",), fuses=("last",))
    np.testing.assert_allclose(features[("mean", "last")], tiny_encoder.embed(texts, layers=-1), atol=1e-6)
    out = tmp_path / "o.npz"
    lw.extract_to_file(tiny_encoder, pa.array(texts), out)
    assert lw.read_npz_texts(np.load(out)) == texts
    with pytest.raises(lw.InputError, match=r"texts\[1\] is NoneType"):
        tiny_encoder.embed(pa.array(["a", None, "c"]))
    with pytest.raises(lw.InputError, match="must be an iterable of strings, not int"):
        tiny_encoder.embed(3)
