"""The packed (unpadded) forward equals the padded Hugging Face forward at every layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import ARCHITECTURES, ud_sentences

import layerwise as lw
from layerwise._model.forward.packed import PACKED_MODEL_TYPES, PackedEncoder

TEXTS = ud_sentences("dev", 40)


def pair_of_encoders(folder, **options):
    packed = lw.Encoder(folder, device="cpu", **options)
    return packed, lw.Encoder(folder, device="cpu", packed=False, **options)


def assert_same(packed_results, padded_results, atol=1e-5):
    assert len(packed_results) == len(padded_results)
    for a, b in zip(packed_results, padded_results, strict=True):
        assert a.tokens == b.tokens and a.layers == b.layers and a.n_windows == b.n_windows
        np.testing.assert_allclose(a.hidden, b.hidden, atol=atol, rtol=0)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_packed_equals_padded_at_every_layer(make_tiny_model, arch):
    packed, padded = pair_of_encoders(make_tiny_model(arch, 3))
    assert (packed.engine.packed is not None) == (arch in PACKED_MODEL_TYPES)
    assert padded.engine.packed is None
    long_text = " ".join(ud_sentences("dev", 12))  # over the tiny models' 127-128 tokens
    texts = [*TEXTS, long_text, "a", "[SEP] typed as text"]
    assert_same(packed.extract(texts), padded.extract(texts))  # mixed lengths, one truncated
    firsts, seconds = TEXTS[:12], TEXTS[12:24]
    assert_same(packed.extract(firsts, text_pairs=seconds), padded.extract(firsts, text_pairs=seconds))
    windowed = {"long_texts": "window", "stride": 40}
    both = [long_text, "short"]
    assert_same(packed.extract(both, **windowed), padded.extract(both, **windowed))
    words = [t.split() for t in TEXTS[:8]]
    assert_same(packed.extract(words=words), padded.extract(words=words))
    # a subset of layers, in any order, stops at the deepest one
    assert_same(packed.extract(TEXTS[:6], layers=[2, 0]), padded.extract(TEXTS[:6], layers=[2, 0]))


@pytest.mark.parametrize("onednn", ["1", "0"])  # the linear layers on oneDNN, and on F.linear
def test_default_model_packed_equals_padded(default_encoder, default_model_dir, monkeypatch, onednn):
    from layerwise._model.forward import cpu_gemm

    monkeypatch.setenv("LAYERWISE_ONEDNN", onednn)
    monkeypatch.setattr(cpu_gemm, "_checked", None)
    if onednn == "1" and not cpu_gemm.onednn_usable():
        pytest.skip("this torch build has no usable oneDNN linear")
    padded = lw.Encoder(default_model_dir, device="cpu", packed=False)
    assert default_encoder.engine.packed is not None
    default_encoder.engine.packed.linear.forget()
    texts = ud_sentences("dev", 200)
    assert_same(default_encoder.extract(texts), padded.extract(texts))
    assert bool(default_encoder.engine.packed.linear._packed) == (onednn == "1")  # that path ran


def test_packed_runs_only_the_layers_needed(make_tiny_model, monkeypatch):
    packed, _ = pair_of_encoders(make_tiny_model("bert", 4))
    calls: list[int] = []
    forward = packed.engine.packed
    layers, run_layer = forward.layers, forward.run_layer

    def counted(layer, h, batch):
        calls.append(layers.index(layer))
        return run_layer(layer, h, batch)

    monkeypatch.setattr(forward, "run_layer", counted)
    packed.extract(["one text", "and another one"], layers=[2])
    assert calls == [0, 1]  # one packed batch, layers 1 and 2 only
    packed.extract(["one text"], layers=[0])  # the embeddings: no layer runs at all
    assert calls == [0, 1]
    packed.extract(["one text"])
    assert calls == [0, 1, 0, 1, 2, 3]


def test_taps_and_hooks_use_the_hugging_face_forward(make_tiny_model, monkeypatch):
    packed, padded = pair_of_encoders(make_tiny_model("bert"))

    def refuse(*args, **kwargs):
        raise AssertionError("the packed forward ran")

    monkeypatch.setattr(packed.engine.packed, "forward", refuse)
    tapped = packed.extract(TEXTS[:4], taps=["attention_probs", "intermediate"])
    want = padded.extract(TEXTS[:4], taps=["attention_probs", "intermediate"])
    for a, b in zip(tapped, want, strict=True):
        np.testing.assert_array_equal(a.taps["attention_probs"], b.taps["attention_probs"])
    assert_same(packed.extract(TEXTS[:4], method="hooks"), padded.extract(TEXTS[:4]))


def test_half_precision_packed_close_to_padded(make_tiny_model):
    packed, padded = pair_of_encoders(make_tiny_model("bert"), model_dtype="bfloat16")
    assert_same(packed.extract(TEXTS[:10]), padded.extract(TEXTS[:10]), atol=0.05)


def test_unsupported_configs_fall_back():
    from transformers import BertConfig, BertModel

    small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 64}
    relative = BertModel(BertConfig(**small, position_embedding_type="relative_key"))
    assert PackedEncoder.build(relative) is None
    plain = BertModel(BertConfig(**small))
    assert PackedEncoder.build(plain) is not None


@pytest.mark.parametrize("kind", ["xlm-roberta", "camembert"])
def test_packed_roberta_family_models(make_roberta_family, kind):
    """XLM-R and CamemBERT have modelling files of their own: the packed forward must match them too."""
    packed, padded = pair_of_encoders(make_roberta_family(kind))
    assert packed.engine.packed is not None and packed.model_type == kind
    texts = [*TEXTS[:20], " ".join(TEXTS)]
    assert_same(packed.extract(texts), padded.extract(texts))
    assert_same(
        packed.extract(TEXTS[:6], text_pairs=TEXTS[6:12]), padded.extract(TEXTS[:6], text_pairs=TEXTS[6:12])
    )


def test_attention_groups_minimise_padded_attention():
    from layerwise._model.forward.packed import GROUP_COST, attention_groups

    assert attention_groups([30, 29, 28]) == [(0, 3)]  # similar lengths: one grid
    assert attention_groups([7]) == [(0, 1)]
    # one long text among short ones: its own grid (31 x 256^2 of padding saved)
    assert attention_groups([256] + [20] * 31) == [(0, 1), (1, 32)]

    def cost(lengths, groups):
        return sum((b - a) * max(lengths[a:b]) ** 2 + GROUP_COST for a, b in groups)

    # exact over every split of these short batches (runs of similar length are never split apart)
    import itertools

    for lengths in ([120, 100, 60, 58, 20, 3], [64, 64, 40, 8, 8, 8, 2]):
        b = len(lengths)
        best = min(
            cost(lengths, list(zip((0, *cuts), (*cuts, b), strict=True)))
            for k in range(b)
            for cuts in itertools.combinations(range(1, b), k)
        )
        assert cost(lengths, attention_groups(lengths)) == best
    assert attention_groups([5, 256, 7]) == [(0, 1), (1, 2), (2, 3)]  # unsorted input still splits


def test_mixed_lengths_in_one_packed_batch_equal_padded(make_tiny_model, monkeypatch):
    """A server's merged requests: one batch of very different lengths runs attention in several
    grids (and the real-token budget keeps it one batch); the numbers stay the padded forward's."""
    import layerwise._model.forward.packed as packed_module

    packed, padded = pair_of_encoders(make_tiny_model("bert", 3), concurrent_forwards=1)  # 2 would split it
    seen: list[list[tuple[int, int]]] = []
    real = packed_module.attention_groups

    def spy(lengths, group_cost=None):
        seen.append(real(lengths, group_cost))
        return seen[-1]

    monkeypatch.setattr(packed_module, "attention_groups", spy)
    long_text = " ".join(ud_sentences("dev", 6))
    texts = [TEXTS[0], long_text, "a", *TEXTS[1:9], "b c", TEXTS[20][:40]]
    assert_same(packed.extract(texts), padded.extract(texts))
    assert len(seen) == 1 and len(seen[0]) >= 3  # one batch, attention in 3+ grids


def test_attention_on_a_gpu_leaves_cudnn_out_and_the_cpu_alone():
    # cuDNN's attention builds a plan per new grid shape: 7.3 s of a fresh Encoder's first embed on
    # an H100 (model/sdpa.py). The flags are process-wide: set inside, restored after, untouched on CPU.
    from layerwise._model.forward.sdpa import attention_kernels

    before = torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()
    with attention_kernels(torch.device("cpu")):
        assert (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()) == before
    with attention_kernels(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()) == before
