import numpy as np
import pytest
import torch

import layerwise as lw
from layerwise._features.fuse import fusion_layers
from layerwise.errors import OptionError

# 7 hidden states (6 layers), one token, hidden 2: h_k = [k, 10 k]
HIDDEN = np.array([[[k, 10 * k]] for k in range(7)], dtype=np.float32)  # (7, 1, 2)
ALL = tuple(range(7))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("embeddings", [[0, 0]]),
        ("last", [[6, 60]]),
        ("second_to_last", [[5, 50]]),
        ("sum_last4", [[18, 180]]),
        ("mean_last4", [[4.5, 45]]),
        ("concat_last4", [[3, 30, 4, 40, 5, 50, 6, 60]]),
        ("sum_all", [[21, 210]]),
        ("mean_all", [[3, 30]]),
        ("mean", [[3, 30]]),
        ("sum", [[21, 210]]),
    ],
)
def test_fusions_known_answers(name, expected):
    np.testing.assert_allclose(lw.fuse_layers(HIDDEN, ALL, name, n_hidden_states=7), expected)


def test_fusion_on_other_axis_and_order():
    batch = np.stack([HIDDEN[:, 0], 2 * HIDDEN[:, 0]])  # (2 texts, 7 layers, 2)
    np.testing.assert_allclose(
        lw.fuse_layers(batch, ALL, "last", n_hidden_states=7, axis=1), [[6, 60], [12, 120]]
    )
    # concatenation follows the model's layer order even when layers were extracted in another order
    reversed_layers = tuple(reversed(ALL))
    flipped = HIDDEN[::-1]
    np.testing.assert_allclose(
        lw.fuse_layers(flipped, reversed_layers, "concat_last4", n_hidden_states=7),
        [[3, 30, 4, 40, 5, 50, 6, 60]],
    )


def test_fusion_layers_and_errors():
    assert fusion_layers("concat_last4", 13) == (9, 10, 11, 12)
    assert fusion_layers("second_to_last", 13) == (11,)
    assert fusion_layers("mean", 13) is None
    with pytest.raises(OptionError, match="fuse='last5' is not valid; choose one of embeddings, last"):
        lw.fuse_layers(HIDDEN, ALL, "last5", n_hidden_states=7)
    with pytest.raises(OptionError, match=r"needs hidden states \(3, 4, 5, 6\) but \[3\] were not extracted"):
        lw.fuse_layers(HIDDEN[[0, 4, 5, 6]], (0, 4, 5, 6), "sum_last4", n_hidden_states=7)
    with pytest.raises(OptionError, match="needs 'last4'"):
        fusion_layers("sum_last4", 3)


def test_layer_deltas_and_drift():
    hidden = np.array([[[1, 0], [0, 2]], [[1, 1], [0, -2]]], dtype=np.float32)  # (2 layers, 2 tokens, 2)
    np.testing.assert_array_equal(lw.layer_deltas(hidden), [[[0, 1], [0, -4]]])
    distance, cosine = lw.layer_drift(hidden)
    np.testing.assert_allclose(distance, [[1, 4]])
    np.testing.assert_allclose(cosine, [[1 / np.sqrt(2), -1]])


def numpy_scalar_mix(layers, weights, gamma, mask=None, layer_norm=False):
    layers = np.asarray(layers, dtype=np.float64)
    if layer_norm:
        m = np.ones(layers.shape[1:-1]) if mask is None else mask.astype(np.float64)
        m = m[..., None]
        n = m.sum() * layers.shape[-1]
        out = []
        for h in layers:
            mean = (h * m).sum() / n
            var = (((h - mean) * m) ** 2).sum() / n
            out.append((h - mean) / np.sqrt(var + 1e-12))
        layers = np.stack(out)
    shares = np.exp(weights) / np.exp(weights).sum()
    return gamma * np.tensordot(shares, layers, axes=1)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_scalar_mix_matches_numpy(layer_norm):
    rng = np.random.default_rng(0)
    layers = rng.normal(size=(4, 3, 5, 8)).astype(np.float32)  # (layers, batch, tokens, dim)
    mask = np.ones((3, 5))
    mask[1, 3:] = 0
    weights = [0.1, -0.3, 0.7, 0.2]
    mix = lw.ScalarMix(4, layer_norm=layer_norm, initial_weights=weights, initial_gamma=1.5)
    got = mix(torch.from_numpy(layers), torch.from_numpy(mask)).detach().numpy()
    expected = numpy_scalar_mix(layers, np.array(weights), 1.5, mask, layer_norm)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # a list of tensors works too
    np.testing.assert_allclose(
        mix([torch.from_numpy(x) for x in layers], torch.from_numpy(mask)).detach().numpy(), got
    )


def test_scalar_mix_trains_towards_the_informative_layer():
    torch.manual_seed(0)
    target = torch.randn(64, 8)
    noise = [torch.randn(64, 8) for _ in range(3)]
    layers = torch.stack([noise[0], target, noise[1], noise[2]])
    mix = lw.ScalarMix(4)
    assert mix.center_of_gravity() == pytest.approx(1.5)
    optimizer = torch.optim.Adam(mix.parameters(), lr=0.1)
    for _ in range(200):
        optimizer.zero_grad()
        loss = ((mix(layers) - target) ** 2).mean()
        loss.backward()
        optimizer.step()
    shares = mix.normalized_weights().detach()
    assert int(shares.argmax()) == 1 and float(shares[1]) > 0.9
    assert mix.center_of_gravity() == pytest.approx(1.0, abs=0.2)
    with pytest.raises(OptionError, match="initial_weights has 2 values for 4 layers"):
        lw.ScalarMix(4, initial_weights=[0, 1])
