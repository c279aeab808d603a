"""Sliding windows: stitched results equal direct forwards of the covering windows."""

import numpy as np
import pytest
import torch

import layerwise as lw
from layerwise._inputs.windows import plan_windows
from layerwise.errors import InputError, OptionError


def max_context_window(spans, position):
    """google-research/bert run_squad.py _check_is_max_context, re-implemented from the paper code."""
    best_score, best = None, None
    for k, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best = score, k
    return best


@pytest.fixture(scope="module")
def short_encoder(make_tiny_model):
    return lw.Encoder(make_tiny_model("bert"), device="cpu", max_length=16)


def test_stitching_equals_direct_window_forwards(short_encoder):
    enc = short_encoder
    text = " ".join(f"token{i % 7} word{i}" for i in range(20))
    stack = enc.extract([text], long_texts="window", stride=5)[0]
    item = enc.inputs.encode(lw._inputs.raw.normalize_inputs([text]), truncate=False)[0]
    assert stack.n_tokens == len(item) > 16 and not stack.truncated
    content = item.ids[1:-1]
    room, stride = 14, 5
    spans, start = [], 0
    while True:
        length = min(room, len(content) - start)
        spans.append((start, length))
        if start + length >= len(content):
            break
        start += min(length, stride)
    assert stack.n_windows == len(spans) > 2
    direct = []
    with torch.inference_mode():
        for start, length in spans:
            ids = torch.tensor([[item.ids[0], *content[start : start + length], item.ids[-1]]])
            states = enc.model(input_ids=ids, output_hidden_states=True).hidden_states
            direct.append(torch.stack(states)[:, 0].numpy())
    for p in range(len(content)):
        k = max_context_window(spans, p)
        expected = direct[k][:, 1 + p - spans[k][0]]
        np.testing.assert_allclose(stack.hidden[:, 1 + p], expected, atol=1e-5)
    np.testing.assert_allclose(stack.hidden[:, 0], direct[0][:, 0], atol=1e-5)  # [CLS] from the first
    np.testing.assert_allclose(stack.hidden[:, -1], direct[-1][:, -1], atol=1e-5)  # [SEP] from the last
    assert stack.tokens == item.tokens


def test_text_that_fits_is_exactly_unwindowed(short_encoder):
    texts = ["short text", "another short one here"]
    a = short_encoder.extract(texts)
    b = short_encoder.extract(texts, long_texts="window")
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.hidden, y.hidden)
        assert y.n_windows == 1


def test_pairs_slide_over_second_segment(short_encoder):
    first, second = "what is it", " ".join(f"w{i}" for i in range(30))
    stack = short_encoder.extract(pairs=[(first, second)], long_texts="window")[0]
    assert stack.n_windows > 1 and not stack.truncated
    assert stack.segment_ids.tolist().count(0) == 5  # [CLS] what is it [SEP]
    words = short_encoder.embed_words(pairs=[(first, second)], long_texts="window")[0]
    assert words.words[3:] == tuple(second.split())


def test_pair_with_long_first_segment_cannot_be_windowed(short_encoder):
    with pytest.raises(InputError, match="windows slide over the second segment only"):
        short_encoder.extract(pairs=[(" ".join(["a"] * 30), "b")], long_texts="window")


def test_window_options_are_checked(short_encoder):
    long_text = " ".join(["word"] * 40)
    with pytest.raises(OptionError, match="stride=99 must be between 1 and"):
        short_encoder.extract([long_text], long_texts="window", stride=99)
    with pytest.raises(OptionError, match="long_texts='slide' is not valid"):
        short_encoder.extract([long_text], long_texts="slide")
    with pytest.raises(OptionError, match="attention_probs cannot be stitched"):
        short_encoder.extract([long_text], long_texts="window", taps=["attention_probs"])
    stack = short_encoder.extract([long_text], long_texts="window", taps=["intermediate"])[0]
    assert stack.taps["intermediate"].shape == (3, stack.n_tokens, 64)


def test_plan_covers_every_token_once_or_more(short_encoder):
    item = short_encoder.inputs.encode(
        lw._inputs.raw.normalize_inputs([" ".join(["x"] * 50)]), truncate=False
    )[0]
    windows = plan_windows(item, 16)
    covered = np.zeros(len(item), dtype=int)
    for w in windows:
        assert len(w) <= 16
        covered[w.positions] += 1
    assert (covered >= 1).all()


def test_the_window_memory_guard_counts_words_as_tokens(default_encoder):
    """200,000 one-token words would hold 2.0 GiB of hidden states (7 x 384 float32 per token):
    over the guard's 2 GiB, refused before tokenising. Counted by characters (4 per token) they
    looked like 100,000 tokens and ran for minutes."""
    import time

    import layerwise as lw

    started = time.perf_counter()
    with pytest.raises(
        lw.InputTooLargeError, match=r"input 0 has 200,000 words: .* limit .* is 199,728 words"
    ):
        default_encoder.extract(words=[["w"] * 200_000], long_texts="window")
    assert time.perf_counter() - started < 5
    text = " ".join(["w"] * 200_000)  # the same as one text: 399,999 characters, under 798,912
    from layerwise._inputs.raw import normalize_inputs
    from layerwise._inputs.windows import check_window_memory

    check_window_memory(normalize_inputs([text]), 7, 384)  # passes: a text is counted by characters
