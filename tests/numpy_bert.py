"""An independent NumPy forward pass of BERT, for parity tests. float64 throughout.

Written from the BERT paper and the published weight layout, not from the transformers code:
embeddings (token + position + segment) with LayerNorm; per layer multi-head attention
softmax(Q K^T / sqrt(d_k) + mask) V, dense + residual + LayerNorm, GELU feed-forward + residual +
LayerNorm. Returns every hidden state: index 0 is the embedding output.
"""

from __future__ import annotations

import math

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def linear(x: np.ndarray, weights: dict, name: str) -> np.ndarray:
    return x @ weights[f"{name}.weight"].T + weights[f"{name}.bias"]


def bert_forward(
    weights: dict[str, np.ndarray],
    *,
    n_layers: int,
    n_heads: int,
    eps: float,
    input_ids: np.ndarray,
    token_type_ids: np.ndarray,
    attention_mask: np.ndarray,
    prefix: str = "",
) -> list[np.ndarray]:
    w = {k.removeprefix(prefix): v.astype(np.float64) for k, v in weights.items()}
    batch, length = input_ids.shape
    positions = np.arange(length)
    x = (
        w["embeddings.word_embeddings.weight"][input_ids]
        + w["embeddings.position_embeddings.weight"][positions][None]
        + w["embeddings.token_type_embeddings.weight"][token_type_ids]
    )
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    states = [x]
    hidden = x.shape[-1]
    head = hidden // n_heads
    # padding keys get -inf before the softmax, so real tokens never attend to them
    bias = np.where(attention_mask[:, None, None, :] > 0, 0.0, -np.inf)

    def heads(t: np.ndarray) -> np.ndarray:  # (B, T, H) -> (B, nh, T, hs)
        return t.reshape(batch, length, n_heads, head).transpose(0, 2, 1, 3)

    for i in range(n_layers):
        p = f"encoder.layer.{i}."
        q = heads(linear(x, w, p + "attention.self.query"))
        k = heads(linear(x, w, p + "attention.self.key"))
        v = heads(linear(x, w, p + "attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head) + bias  # (B, nh, T, T)
        scores = scores - scores.max(-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
        attended = layer_norm(
            linear(context, w, p + "attention.output.dense") + x,
            w[p + "attention.output.LayerNorm.weight"],
            w[p + "attention.output.LayerNorm.bias"],
            eps,
        )
        inner = gelu(linear(attended, w, p + "intermediate.dense"))
        x = layer_norm(
            linear(inner, w, p + "output.dense") + attended,
            w[p + "output.LayerNorm.weight"],
            w[p + "output.LayerNorm.bias"],
            eps,
        )
        states.append(x)
    return states
