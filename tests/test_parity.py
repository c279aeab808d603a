"""The default model's hidden states equal an independent NumPy forward pass, every layer."""

import numpy as np
from numpy_bert import bert_forward
from safetensors.numpy import load_file

SENTENCES = [
    "From the AP comes this story:",
    "President Bush on Tuesday nominated two individuals to replace retiring jurists on federal courts.",
    "Hi!",
    "The bank raised rates, and we sat on the river bank.",
]


def test_default_model_matches_numpy_forward(default_model_dir):
    """A fresh Encoder runs the light model (weights read from safetensors, no transformers class):
    that is the model compared here, checked not to have been replaced on the way."""
    import layerwise as lw

    enc = lw.Encoder(device="cpu")
    config = enc.config
    weights = load_file(str(default_model_dir / "model.safetensors"))
    # one batch that needs padding, including a sentence pair (segment ids 0 and 1)
    stacks = enc.extract(SENTENCES[:3], batch_size=8) + enc.extract(pairs=[(SENTENCES[3], "Yes, it did.")])
    encoded = enc.tokenize(SENTENCES[:3]) + enc.tokenize(pairs=[(SENTENCES[3], "Yes, it did.")])
    width = max(len(e) for e in encoded)
    ids = np.zeros((len(encoded), width), dtype=np.int64)
    types = np.zeros_like(ids)
    mask = np.zeros_like(ids)
    for row, e in enumerate(encoded):
        ids[row, : len(e)] = e.ids
        types[row, : len(e)] = e.type_ids
        mask[row, : len(e)] = 1
    assert mask.min() == 0 and types.max() == 1  # padding and a second segment are exercised
    reference = bert_forward(
        weights,
        n_layers=config.num_hidden_layers,
        n_heads=config.num_attention_heads,
        eps=config.layer_norm_eps,
        input_ids=ids,
        token_type_ids=types,
        attention_mask=mask,
    )
    assert len(reference) == 7
    worst = 0.0
    for row, stack in enumerate(stacks):
        n = stack.n_tokens
        for layer in range(7):
            diff = np.abs(stack.layer(layer) - reference[layer][row, :n]).max()
            worst = max(worst, float(diff))
    assert worst <= 1e-4, f"max abs diff {worst}"
    assert not enc.models.built  # the light model was compared, not transformers'


def test_hooks_equal_output_hidden_states_on_default_model(default_encoder):
    import layerwise as lw

    hugging_face = lw.Encoder(device="cpu", packed=False)  # both methods on its forward: exactly equal
    a = hugging_face.extract(SENTENCES, method="hidden_states")
    b = hugging_face.extract(SENTENCES, method="hooks")
    packed = default_encoder.extract(SENTENCES)
    for x, y, z in zip(a, b, packed, strict=True):
        np.testing.assert_array_equal(x.hidden, y.hidden)
        np.testing.assert_allclose(z.hidden, x.hidden, atol=1e-5, rtol=0)
