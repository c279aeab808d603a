import numpy as np
import pytest
import torch
from conftest import ARCHITECTURES

import layerwise as lw
from layerwise.errors import LayerSpecError, ModelLoadError, OptionError

TEXTS = [
    "The bank raised rates.",
    "We sat on the river bank and watched the boats go by for a long while.",
    "Hi",
    "",
]


def test_default_encoder_properties(default_encoder, default_hf_model):
    enc = default_encoder
    assert enc.name == lw.DEFAULT_MODEL
    assert (enc.n_layers, enc.n_hidden_states, enc.hidden_size) == (6, 7, 384)
    assert enc.max_length == 256  # sentence_bert_config.json: max_seq_length
    assert enc.sentence_transformers == lw._model.loading.sentence_transformers.SentenceTransformersConfig(
        256, "mean", True
    )
    assert default_hf_model.training is False
    assert enc.tokenizer.is_fast
    stacks = enc.extract(["The bank raised rates.", "We sat on the river bank."])
    s = stacks[0]
    assert s.hidden.dtype == np.float32 and s.hidden.shape == (7, 7, 384)
    assert s.layers == (0, 1, 2, 3, 4, 5, 6)
    assert s.tokens == ("[CLS]", "the", "bank", "raised", "rates", ".", "[SEP]")
    assert s.offsets.tolist() == [[0, 0], [0, 3], [4, 8], [9, 15], [16, 21], [21, 22], [0, 0]]
    assert s.word_ids.tolist() == [-1, 0, 1, 2, 3, 4, -1]
    assert s.segment_ids.tolist() == [0] * 7


def test_results_match_a_direct_forward(default_encoder, default_hf_model):
    """Batched, sorted, truncated-at-depth extraction (the light model's) equals a plain HF forward
    per text."""
    enc = default_encoder
    stacks = enc.extract(TEXTS, batch_size=3)
    for text, stack in zip(TEXTS, stacks, strict=True):
        inputs = enc.tokenizer([text], return_tensors="pt")
        with torch.inference_mode():
            reference = default_hf_model(**inputs, output_hidden_states=True).hidden_states
        expected = torch.stack(reference)[:, 0].numpy()
        np.testing.assert_allclose(stack.hidden, expected, atol=2e-5, rtol=0)
        assert stack.text == text


def test_single_string_gives_single_result(tiny_encoder):
    stack = tiny_encoder.extract("one text")
    assert isinstance(stack, lw.LayerStack) and stack.text == "one text"


def test_order_restored_and_batch_size_independent(tiny_encoder):
    texts = [f"text number {i} " + "word " * (i % 7) for i in range(23)]
    one = tiny_encoder.extract(texts, batch_size=1)
    many = tiny_encoder.extract(texts, batch_size=8)
    for a, b, text in zip(one, many, texts, strict=True):
        assert a.text == b.text == text
        np.testing.assert_allclose(a.hidden, b.hidden, atol=1e-5, rtol=0)


def test_layer_selection_and_order(tiny_encoder):
    full = tiny_encoder.extract(["a short test"])[0]
    picked = tiny_encoder.extract(["a short test"], layers=[-1, 0, 2])[0]
    assert picked.layers == (3, 0, 2)
    for k, layer in enumerate(picked.layers):
        np.testing.assert_array_equal(picked.hidden[k], full.hidden[layer])
        np.testing.assert_array_equal(picked.layer(layer), full.layer(layer))
    with pytest.raises(LayerSpecError, match="hidden state 1 was not extracted"):
        picked.layer(1)
    with pytest.raises(LayerSpecError, match="this model has 4 hidden states, 0 = embeddings … 3"):
        tiny_encoder.extract(["x"], layers=4)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_architectures_hooks_equal_hidden_states(make_tiny_model, arch):
    # both collect the Hugging Face forward's states: exactly equal (the packed forward, which runs on
    # its own threads with other kernels' rounding, is held to 1e-5 in test_packed.py)
    enc = lw.Encoder(make_tiny_model(arch), device="cpu", packed=False)
    assert enc.n_hidden_states == 4 and enc.model_type == arch
    texts = ["The bank raised rates.", "Hi", "Another, longer sentence to force some padding here."]
    by_output = enc.extract(texts, method="hidden_states")
    by_hooks = enc.extract(texts, method="hooks")
    for a, b in zip(by_output, by_hooks, strict=True):
        assert a.hidden.shape == (4, a.n_tokens, 32)
        np.testing.assert_array_equal(a.hidden, b.hidden)
    pair = enc.extract(pairs=[("Is it raining?", "Yes, it is.")], layers="last2")[0]
    assert pair.segment_ids.tolist() == [0] * 6 + [1] * 6
    assert pair.layers == (2, 3)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_sub_layer_taps(make_tiny_model, arch):
    enc = lw.Encoder(make_tiny_model(arch), device="cpu")
    before = enc.model.config._attn_implementation
    texts = ["Attention please, everyone.", "Hi"]
    stacks = enc.extract(texts, layers=[0, 1, 3], taps=lw.TAPS)
    plain = enc.extract(texts, layers=[0, 1, 3])
    for stack, reference in zip(stacks, plain, strict=True):
        n = stack.n_tokens
        assert stack.tap_layers == (1, 3)
        assert stack.taps["attention_probs"].shape == (2, 4, n, n)
        np.testing.assert_allclose(stack.taps["attention_probs"].sum(-1), 1.0, atol=1e-5)
        assert stack.taps["attention_output"].shape == (2, n, 32)
        assert stack.taps["intermediate"].shape == (2, n, 64)
        assert stack.taps["attn_out"].shape == stack.taps["mlp_out"].shape == (2, n, 32)
        # eager attention (switched on for the taps) agrees with the default path
        np.testing.assert_allclose(stack.hidden, reference.hidden, atol=1e-5)
    # the switch is undone afterwards
    assert enc.model.config._attn_implementation == before


def test_taps_known_answer_bert(tiny_encoder):
    """intermediate = GELU(attention_output W1 + b1);
    layer output = LN(intermediate W2 + b2 + attention_output)."""
    stack = tiny_encoder.extract(
        ["Known answers for the taps."],
        layers=[1, 2],
        taps=["attention_output", "intermediate", "attn_out", "mlp_out"],
    )[0]
    layer = tiny_encoder.model.encoder.layer[1]  # hidden state 2 is the output of the second layer
    attended = torch.from_numpy(stack.taps["attention_output"][1])
    with torch.inference_mode():
        inner = torch.nn.functional.gelu(layer.intermediate.dense(attended))
        out = layer.output.LayerNorm(layer.output.dense(inner) + attended)
        # attn_out, mlp_out: what each block adds before its residual add and LayerNorm
        before = torch.from_numpy(stack.hidden[0])
        normed = layer.attention.output.LayerNorm(torch.from_numpy(stack.taps["attn_out"][1]) + before)
        after = layer.output.LayerNorm(torch.from_numpy(stack.taps["mlp_out"][1]) + attended)
    np.testing.assert_allclose(stack.taps["intermediate"][1], inner.numpy(), atol=1e-6)
    np.testing.assert_allclose(stack.hidden[1], out.numpy(), atol=1e-6)
    np.testing.assert_allclose(normed.numpy(), stack.taps["attention_output"][1], atol=1e-5)
    np.testing.assert_allclose(after.numpy(), stack.hidden[1], atol=1e-5)


def test_bad_tap_and_method(tiny_encoder):
    with pytest.raises(OptionError, match="taps item='values' is not valid; choose one of 'attention_probs'"):
        tiny_encoder.extract(["x"], taps=["values"])
    with pytest.raises(OptionError, match="method='magic' is not valid"):
        tiny_encoder.extract(["x"], method="magic")


def test_forward_stops_at_deepest_requested_layer(make_tiny_model):
    # the Hugging Face forward (the packed one: test_packed.py)
    enc = lw.Encoder(make_tiny_model("bert", n_layers=6), device="cpu", packed=False)
    calls = [0] * 6
    handles = [
        layer.register_forward_hook(lambda m, a, o, i=i: calls.__setitem__(i, calls[i] + 1))
        for i, layer in enumerate(enc.model.encoder.layer)
    ]
    try:
        shallow = enc.extract(["stop early please"], layers=[2])[0]
        assert calls == [1, 1, 0, 0, 0, 0]
        enc.extract(["stop early please"], layers=[0])  # hidden state 0 needs the first layer's input
        assert calls == [2, 1, 0, 0, 0, 0]
        full = enc.extract(["stop early please"])[0]
        assert calls == [3, 2, 1, 1, 1, 1]
    finally:
        for handle in handles:
            handle.remove()
    np.testing.assert_array_equal(shallow.hidden[0], full.layer(2))
    assert len(enc.model.encoder.layer) == 6  # the encoder is whole again


def test_iter_extract_streams_longest_first(tiny_encoder):
    texts = ["a", "a b c d e f", "a b c"]
    order = [i for i, _ in tiny_encoder.iter_extract(texts, batch_size=1)]
    assert order == [1, 2, 0]


def test_iter_extract_validates_eagerly(tiny_encoder):
    with pytest.raises(LayerSpecError):
        tiny_encoder.iter_extract(["x"], layers=99)  # raises before iteration starts


def test_missing_model_folder(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        lw.Encoder(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="does not exist"):
        lw.Encoder("./no/such/folder")


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match=r"has no config\.json"):
        lw.Encoder(tmp_path)


def test_hub_name_not_available_offline():
    with pytest.raises(ModelLoadError) as info:
        lw.Encoder("no-such-org/no-such-model-layerwise")
    message = str(info.value)
    assert "'no-such-org/no-such-model-layerwise' is not a local folder and is not in the Hugging" in message
    assert "pass a local folder" in message


def test_loads_local_folder_by_path_object(make_tiny_model):
    folder = make_tiny_model("bert")
    enc = lw.Encoder(folder, device="cpu")
    assert enc.name == str(folder) and enc.n_layers == 3


def test_bad_options(make_tiny_model):
    folder = make_tiny_model("bert")
    with pytest.raises(OptionError, match="dtype='float8' is not valid"):
        lw.Encoder(folder, model_dtype="float8")
    with pytest.raises(OptionError, match="device='tpu9'"):
        lw.Encoder(folder, device="tpu9")


def test_half_precision_model_returns_float32(make_tiny_model):
    enc = lw.Encoder(make_tiny_model("bert"), device="cpu", model_dtype="bfloat16")
    stack = enc.extract(["low precision"])[0]
    reference = lw.Encoder(make_tiny_model("bert"), device="cpu").extract(["low precision"])[0]
    assert stack.hidden.dtype == np.float32
    np.testing.assert_allclose(stack.hidden, reference.hidden, atol=0.1)


def test_batch_size_defaults_to_the_devices_and_a_given_one_is_kept(tiny_encoder, make_tiny_model):
    # None in Settings: 128 inputs a batch on the CPU, 1024 on a GPU (encoder/core.py); given: kept
    from layerwise._encoder.loading import CPU_BATCH_SIZE, GPU_BATCH_SIZE

    assert (CPU_BATCH_SIZE, GPU_BATCH_SIZE) == (128, 1024)
    assert tiny_encoder.settings.batch_size is None
    assert tiny_encoder.batch_size == tiny_encoder.engine.batch_size == 128
    assert tiny_encoder.run_meta(lw.OutputPlan())["batch_size"] == 128  # what ran, resolved: not None
    given = lw.Encoder(make_tiny_model("bert"), device="cpu", batch_size=7)
    assert given.batch_size == given.engine.batch_size == given.settings.batch_size == 7
