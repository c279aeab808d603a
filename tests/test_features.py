import numpy as np
import pytest

from layerwise.errors import OptionError

TEXTS = ["The bank raised rates.", "We sat on the river bank.", "Hi", ""]


def test_embed_shapes_and_values(tiny_encoder):
    stacks = tiny_encoder.extract(TEXTS)
    everything = tiny_encoder.embed(TEXTS)
    assert everything.shape == (4, 4, 32)
    for row, stack in zip(everything, stacks, strict=True):
        np.testing.assert_allclose(row, stack.hidden.mean(axis=1), atol=1e-6)
    cls = tiny_encoder.embed(TEXTS, pool="cls", fuse="concat_last4")
    assert cls.shape == (4, 4 * 32)
    np.testing.assert_allclose(cls[0], np.concatenate(stacks[0].hidden[:, 0]), atol=1e-6)
    one = tiny_encoder.embed("The bank raised rates.", fuse="last")
    np.testing.assert_allclose(one, stacks[0].hidden[-1].mean(axis=0), atol=1e-6)


def test_embed_pairs_and_layers(tiny_encoder):
    pair = tiny_encoder.embed(pairs=[("q", "a")], layers=[1, 2], pool="max")
    stack = tiny_encoder.extract(pairs=[("q", "a")], layers=[1, 2])[0]
    np.testing.assert_array_equal(pair[0], stack.hidden.max(axis=1))
    generic = tiny_encoder.embed(TEXTS, layers="1:3", fuse="concat")
    assert generic.shape == (4, 64)


def test_named_fusion_with_layers_is_refused(tiny_encoder):
    with pytest.raises(OptionError, match="fuse='last' uses its own hidden states; drop layers="):
        tiny_encoder.embed(TEXTS, layers=[1], fuse="last")


def test_features_from_one_pass_equal_separate_calls(tiny_encoder, monkeypatch):
    calls = []
    original = tiny_encoder.iter_extract

    def counting(*args, **kwargs):
        calls.append(kwargs.get("layers"))
        return original(*args, **kwargs)

    monkeypatch.setattr(tiny_encoder, "iter_extract", counting)
    feats = tiny_encoder.features(TEXTS, pools=["mean", "cls"], fuses=["last", "concat_last4", "mean_all"])
    assert len(calls) == 1
    monkeypatch.undo()
    assert set(feats) == {(p, f) for p in ("mean", "cls") for f in ("last", "concat_last4", "mean_all")}
    for (pool, fusion), array in feats.items():
        np.testing.assert_allclose(array, tiny_encoder.embed(TEXTS, pool=pool, fuse=fusion), atol=1e-6)


def test_features_errors(tiny_encoder):
    with pytest.raises(OptionError, match="at least one pool"):
        tiny_encoder.features(TEXTS, pools=[], fuses=["last"])
    with pytest.raises(OptionError, match="fuse='best'"):
        tiny_encoder.features(TEXTS, fuses=["best"])


def test_default_model_ranks_obvious_similarities(default_encoder):
    """Mean-pooled last layer of all-MiniLM-L6-v2 orders hand-written pairs by meaning."""
    groups = [
        (
            "A man is playing a guitar.",
            ["A person plays the guitar.", "A man is playing a piano.", "Stocks fell sharply today."],
        ),
        (
            "The cat sleeps on the sofa.",
            [
                "A kitten is napping on the couch.",
                "The dog sleeps on the floor.",
                "Parliament passed the budget.",
            ],
        ),
        (
            "How do I reset my password?",
            [
                "I forgot my password, how can I change it?",
                "How do I reset my router?",
                "The weather is lovely.",
            ],
        ),
        (
            "The bank raised interest rates.",
            [
                "The central bank increased borrowing costs.",
                "We walked along the river bank.",
                "She bakes bread.",
            ],
        ),
    ]
    for anchor, candidates in groups:
        vectors = default_encoder.embed([anchor, *candidates], fuse="last")
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        similarity = vectors[1:] @ vectors[0]
        assert list(np.argsort(-similarity)) == [0, 1, 2], (anchor, similarity)
