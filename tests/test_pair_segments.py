"""Sentence pairs keep their two segments apart for every family's real pair convention."""

from __future__ import annotations

import numpy as np
import pytest

import layerwise as lw


@pytest.mark.parametrize("arch", ["roberta", "mpnet", "distilbert"])
def test_pair_segments_and_words(make_pair_convention_model, arch):
    enc = lw.Encoder(make_pair_convention_model(arch), device="cpu")
    first, second = "the bank raised rates", "we sat on the river bank"
    encoded = enc.tokenize([first], text_pairs=[second])[0]
    if arch in ("roberta", "mpnet"):
        assert set(encoded.type_ids) == {0}  # the convention that hid the bug: one type id for both
    stack = enc.extract([first], text_pairs=[second])[0]
    content = [p for p, s in enumerate(encoded.sequence_ids) if s is not None]
    for position in content:
        assert stack.segment_ids[position] == encoded.sequence_ids[position]
    assert stack.segment_ids[0] == 0 and stack.segment_ids[-1] == 1
    # every token's offsets point into the text of its own segment
    for token, (start, end), segment in zip(stack.tokens, stack.offsets, stack.segment_ids, strict=True):
        source = first if segment == 0 else second
        if end > start:
            assert source[start:end].strip() and end <= len(source), (token, start, end, segment)
    vectors = lw.pool_words(stack, "mean")
    assert list(vectors.words) == first.split() + second.split()
    assert vectors.segment_ids.tolist() == [0] * 4 + [1] * 6
    # word k of A and word k of B are different vectors (0.1 merged them for RoBERTa-style pairs)
    assert not np.allclose(vectors.vectors[:, 1], vectors.vectors[:, 5])


def test_pair_words_through_the_store(tmp_path, make_pair_convention_model):
    enc = lw.Encoder(make_pair_convention_model("roberta"), device="cpu")
    lw.extract_to_store(
        enc,
        lw.Corpus.from_inputs(["a b"], text_pairs=["c d e"]),
        tmp_path / "w.lw",
        lw.OutputPlan.parse(dtype="float16", pool="word:first"),
    )
    stored = lw.open_store(tmp_path / "w.lw")[0]
    assert list(stored.words) == ["a", "b", "c", "d", "e"] and stored.segment_ids.tolist() == [0, 0, 1, 1, 1]
