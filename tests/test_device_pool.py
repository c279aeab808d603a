"""Sentence and word plans are made on the model's device (features/device_pool.py): the same numbers
as pooling, fusing and normalising each input's own states on the host, and only the results cross. On
the CPU the same torch code runs with device="cpu"; test_cuda.py runs it on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import corpus, needs_smollm2

import layerwise as lw
from layerwise._features.device_pool import DevicePlan, finish, pool_groups
from layerwise._features.fuse import fuse_layers
from layerwise._features.names import GENERIC_FUSIONS, NAMED_FUSIONS, SENTENCE_POOLS, SUBWORD_POOLS
from layerwise._features.plan import OutputPlan

# mixed lengths, an empty text (no content tokens: "exclude" falls back to the special tokens), a pair
TEXTS = [*corpus(14, seed=7), "", "Hi", "One more, with punctuation: yes!"]
# (layers, fuse): every layer, named fusions (their own layers), a generic fusion over a subset
FUSES = (("all", None), (None, "mean_last4"), (None, "concat_last4"), (None, "sum_all"), ([1, 3, 5], "mean"))


def _host(encoder, plan: OutputPlan, texts, **inputs) -> list:
    """Each input's result as the host computes it: the plan applied to its own states."""
    settled = encoder.settle(plan)
    layers = list(settled.hidden_states(encoder.n_hidden_states))
    stacks = encoder.extract(texts, layers=layers, final_norm=settled.final_norm, **inputs)
    return [settled.result(stack, encoder.n_hidden_states) for stack in stacks]


def _device(encoder, plan: OutputPlan, texts, **inputs) -> list:
    results = {index: (stack, result) for index, stack, result in encoder.iter_results(plan, texts, **inputs)}
    assert all(stack.pooled is not None and stack.hidden.shape[2] == 0 for stack, _ in results.values())
    return [results[i][1] for i in range(len(results))]


def _same(got: list, want: list) -> None:
    for g, w in zip(got, want, strict=True):
        assert type(g) is type(w)
        got_vectors = g.vectors if hasattr(g, "vectors") else g.vector
        np.testing.assert_allclose(
            got_vectors, w.vectors if hasattr(w, "vectors") else w.vector, atol=1e-5, rtol=1e-5
        )
        if hasattr(w, "words"):
            assert (g.words, g.spans.tolist(), g.n_subwords.tolist(), g.segment_ids.tolist()) == (
                w.words, w.spans.tolist(), w.n_subwords.tolist(), w.segment_ids.tolist())  # fmt: skip


@pytest.mark.parametrize("pool", SENTENCE_POOLS)
@pytest.mark.parametrize("special_tokens", ["include", "exclude"])
def test_every_pool_and_fusion_equals_the_host_path(default_encoder, pool, special_tokens):
    for layers, fuse in FUSES:
        for normalize in (False, True):
            plan = OutputPlan(layers, "sentence", pool, special_tokens, fuse, normalize=normalize)
            _same(_device(default_encoder, plan, TEXTS), _host(default_encoder, plan, TEXTS))


@pytest.mark.parametrize("subword", SUBWORD_POOLS)
def test_every_word_pool_equals_the_host_path(default_encoder, subword):
    for layers, fuse in (("all", None), (None, "concat_last4"), ([2, 4], "sum")):
        plan = OutputPlan(layers, "word", subword, "include", fuse)
        _same(_device(default_encoder, plan, TEXTS), _host(default_encoder, plan, TEXTS))
    words = [["Pre", "split", "\u200b", "words", "."], ["one"]]  # a word with no wordpiece keeps its slot
    plan = OutputPlan("all", "word", subword, "include", None)
    _same(_device(default_encoder, plan, None, words=words), _host(default_encoder, plan, None, words=words))
    pairs = {"text_pairs": [t[::-1] for t in TEXTS]}
    _same(_device(default_encoder, plan, TEXTS, **pairs), _host(default_encoder, plan, TEXTS, **pairs))


def test_pairs_and_a_layer_subset(default_encoder):
    plan = OutputPlan([0, 3, -1], "sentence", "mean", "exclude", None)
    pairs = {"text_pairs": [t[::-1] for t in TEXTS]}
    got, want = _device(default_encoder, plan, TEXTS, **pairs), _host(default_encoder, plan, TEXTS, **pairs)
    assert all(g.vector.shape == (3, 384) for g in got)
    _same(got, want)


@needs_smollm2
@pytest.mark.parametrize("pool", ["mean", "last"])
def test_a_decoder_with_its_final_norm(smollm2, pool):
    for final_norm in (True, "all"):
        plan = OutputPlan("all", "sentence", pool, "include", None, final_norm=final_norm)
        _same(_device(smollm2, plan, TEXTS[:6]), _host(smollm2, plan, TEXTS[:6]))
    words = OutputPlan("all", "word", "mean", "include", None)
    _same(_device(smollm2, words, TEXTS[:6]), _host(smollm2, words, TEXTS[:6]))


def test_only_the_pooled_vectors_cross_from_the_device(default_encoder, monkeypatch):
    import layerwise._engine.packed_runs as engine_module  # where a packed batch is copied to the host

    crossed: list[tuple[int, ...]] = []
    real = engine_module.HostCopy

    def counting(hidden, taps, *dtype):
        crossed.append(tuple(hidden.shape))
        return real(hidden, taps, *dtype)

    monkeypatch.setattr(engine_module, "HostCopy", counting)
    vectors = default_encoder.embed(TEXTS, layers="all", pool="mean")
    n_states, width = default_encoder.n_hidden_states, default_encoder.hidden_size
    assert vectors.shape == (len(TEXTS), n_states, width)
    # one (hidden states, inputs of the batch, width) array per batch: no token axis
    assert all(len(shape) == 3 and shape[0] == n_states and shape[2] == width for shape in crossed)
    assert sum(shape[1] for shape in crossed) == len(TEXTS)
    crossed.clear()
    words = default_encoder.embed_words(TEXTS, layers="all", subword="mean")
    assert sum(shape[1] for shape in crossed) == sum(len(w.words) for w in words)  # one row per word
    crossed.clear()
    fused = default_encoder.embed(TEXTS, fuse="concat_last4", normalize=True)  # fused on the device too
    assert {shape[0] for shape in crossed} == {1} and {shape[2] for shape in crossed} == {4 * width}
    np.testing.assert_allclose(np.linalg.norm(fused, axis=-1), 1.0, rtol=1e-6)
    crossed.clear()
    default_encoder.embed_words(TEXTS, fuse="mean_last4")
    assert {(shape[0], shape[2]) for shape in crossed} == {(1, width)}
    crossed.clear()
    default_encoder.extract(TEXTS, layers="all")  # every token, as asked
    n_tokens = sum(len(item) for item in default_encoder.tokenize(TEXTS))
    assert sum(shape[1] for shape in crossed) == n_tokens


def test_windows_and_unpacked_models_pool_on_the_host_with_the_same_numbers(default_encoder, make_tiny_model):
    long_text = " ".join(corpus(40, seed=2))
    plan = OutputPlan("all", "sentence", "mean", "include", None, long_texts="window", stride=64)
    results = list(default_encoder.iter_results(plan, [long_text, "short"]))
    assert all(stack.pooled is None for _, stack, _ in results)  # windows are stitched on the host
    padded = lw.Encoder(make_tiny_model("bert"), device="cpu", packed=False)
    plan = OutputPlan("all", "sentence", "max", "exclude", None)
    assert all(stack.pooled is None for _, stack, _ in padded.iter_results(plan, TEXTS))
    np.testing.assert_allclose(
        padded.embed(TEXTS, layers="all", pool="max", special_tokens="exclude"),
        lw.Encoder(make_tiny_model("bert"), device="cpu").embed(TEXTS, layers="all", pool="max",
                                                                 special_tokens="exclude"),
        atol=1e-5, rtol=1e-5,
    )  # fmt: skip


def test_pool_groups_in_half_precision_sums_in_float32():
    torch.manual_seed(0)
    states = torch.randn(2, 700, 16) * 40
    owner = np.concatenate([np.zeros(300, dtype=np.int64), np.ones(400, dtype=np.int64)])
    owner[5] = -1  # a token no group pools
    got = pool_groups(states.half(), owner, 2, "mean")
    assert got.dtype == torch.float32
    halves = states.half().float()
    first = torch.cat([halves[:, :5], halves[:, 6:300]], dim=1).mean(1)
    torch.testing.assert_close(
        got, torch.stack([first, halves[:, 300:].mean(1)], dim=1), atol=1e-5, rtol=1e-5
    )
    ends = pool_groups(states, owner, 2, "first_last")
    torch.testing.assert_close(ends, torch.cat([states[:, [0, 300]], states[:, [299, 699]]], dim=-1))
    with pytest.raises(ValueError, match="pool 'median'"):
        pool_groups(states, owner, 2, "median")


@pytest.mark.parametrize("packed", [True, False])
def test_float16_results_are_the_float32_states_rounded_once(default_model_dir, packed):
    """extract(dtype="float16"): cast where the states are (half the bytes cross, no float32 copy is
    made on the host), and the numbers are the float32 states rounded to float16, whatever the path."""
    encoder = lw.Encoder(default_model_dir, device="cpu", packed=packed)
    texts = [*TEXTS, " ".join(corpus(30, seed=4))]
    for long_texts in ("truncate", "window"):
        want = encoder.extract(texts, layers=[0, 2, -1], long_texts=long_texts)
        got = encoder.extract(texts, layers=[0, 2, -1], long_texts=long_texts, dtype="float16")
        for g, w in zip(got, want, strict=True):
            assert g.hidden.dtype == np.float16 and g.hidden.shape == w.hidden.shape
            np.testing.assert_array_equal(g.hidden, w.hidden.astype(np.float16))
    with pytest.raises(lw.errors.OptionError, match="dtype='bfloat16' is not valid"):
        encoder.extract(texts, dtype="bfloat16")


def test_host_copy_casts_before_the_copy(monkeypatch):
    from layerwise._engine.host_copy import HostCopy

    states = torch.randn(3, 5, 4)
    hidden, taps, finite = HostCopy(states, {"mlp_out": states * 2}, torch.float16).arrays()
    assert hidden.dtype == taps["mlp_out"].dtype == np.float16 and finite
    np.testing.assert_array_equal(hidden, states.numpy().astype(np.float16))


def test_embed_in_float16_is_the_float32_vectors_rounded_once(default_encoder):
    want = default_encoder.embed(TEXTS, layers="all", pool="mean", normalize=True)
    got = default_encoder.embed(TEXTS, layers="all", pool="mean", normalize=True, dtype="float16")
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want.astype(np.float16))
    with pytest.raises(lw.errors.OptionError, match="dtype='int8' is not valid"):
        default_encoder.embed(TEXTS, dtype="int8")


@pytest.mark.parametrize("fuse", [*NAMED_FUSIONS, *GENERIC_FUSIONS])
def test_finish_fuses_as_fuse_layers(fuse):
    layers = (0, 2, 4, 5, 6) if fuse in GENERIC_FUSIONS else tuple(range(7))
    pooled = torch.randn(len(layers), 3, 8) * 40
    plan = DevicePlan("sentence", "mean", fuse=fuse, normalize=False, n_hidden_states=7)
    got = finish(pooled, layers, plan)
    want = fuse_layers(pooled.numpy(), layers, fuse, n_hidden_states=7, axis=0)
    assert got.shape == (1, *want.shape)
    np.testing.assert_allclose(got[0].numpy(), want, rtol=1e-6, atol=1e-6)
    normalised = finish(
        pooled, layers, DevicePlan("sentence", "mean", fuse=fuse, normalize=True, n_hidden_states=7)
    )
    np.testing.assert_allclose(
        normalised[0].numpy(),
        want / np.maximum(np.linalg.norm(want, axis=-1, keepdims=True), 1e-12),
        rtol=1e-6,
    )
    zero = finish(
        torch.zeros(len(layers), 1, 8),
        layers,
        DevicePlan("sentence", "mean", fuse=fuse, normalize=True, n_hidden_states=7),
    )
    assert torch.equal(zero, torch.zeros_like(zero))  # a zero vector stays zero, as the host path


def test_embed_words_in_float16_is_the_float32_vectors_rounded_once(default_encoder):
    want = default_encoder.embed_words(TEXTS, layers="all", subword="mean")
    got = default_encoder.embed_words(TEXTS, layers="all", subword="mean", dtype="float16")
    for w, g in zip(want, got, strict=True):
        assert g.vectors.dtype == np.float16 and g.words == w.words
        np.testing.assert_array_equal(g.vectors, w.vectors.astype(np.float16))


def test_the_gpu_warm_up_runs_one_full_batch_and_only_on_a_gpu(default_encoder, monkeypatch):
    from layerwise._encoder import core, warm

    engine = default_encoder.engine
    units = warm.warm_up_units(engine, 100, max_tokens=1024)
    assert len(units) == 1024 // min(engine.max_length, warm.UNIT_TOKENS)
    assert {len(u) for u in units} == {min(engine.max_length, warm.UNIT_TOKENS)}
    assert len(warm.warm_up_units(engine, 100, max_tokens=1)) == 1  # at least one input
    batches = []
    real = engine.forward_units

    def counting(units, **options):
        for ids, rows in real(units, **options):
            batches.append((len(ids), rows[0][0].shape))
            yield ids, rows

    monkeypatch.setattr(engine, "forward_units", counting)
    assert warm.warm_device(engine, 100, default_encoder.n_hidden_states, max_tokens=1024) > 0
    length = min(engine.max_length, warm.UNIT_TOKENS)
    assert batches and sum(n for n, _ in batches) == len(units)
    assert batches[0][1] == (default_encoder.n_hidden_states, length, default_encoder.hidden_size)
    # a CPU Encoder has nothing to set up: it never runs the warm-up
    monkeypatch.setattr(core, "warm_device", lambda *a, **k: pytest.fail("warm-up on the CPU"))
    lw.Encoder(device="cpu")
