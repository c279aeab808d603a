"""A readable BERT encoder that reproduces Hugging Face's BertModel layer by layer.

In the spirit of nanoGPT's model.py: one config dataclass, small modules, shape comments.
Notation: B batch, T tokens, H hidden size, nh heads, hs = H / nh head size, N real tokens in a
packed batch.

    embeddings   h0 = LayerNorm(E_tok[x] + E_pos[t] + E_seg[s])
    attention    A = softmax(Q K^T / sqrt(hs) + M) V,  Q = h Wq + bq, K = h Wk + bk, V = h Wv + bv
                 M = 0 for real keys, -inf for padding; heads are concatenated
    block        a = LayerNorm(h + A Wo + bo)                     (post-LN: residual, then norm)
                 h' = LayerNorm(a + GELU(a W1 + b1) W2 + b2)      GELU(x) = x Phi(x), exact (erf)

``Bert.forward`` returns every hidden state, index 0 = embeddings, like ``output_hidden_states``.
``Bert.forward_packed`` runs the same maths on the concatenated real tokens of a batch: only
attention sees per-sequence blocks, so linear layers, LayerNorm and GELU never touch padding.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ModelLoadError, OptionError


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    pad_token_id: int = 0
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise OptionError(
                f"hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}"
            )

    @classmethod
    def from_dict(cls, data: dict) -> BertConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_hf_dict(self) -> dict:
        """A config.json that transformers reads as a BertConfig."""
        return {
            **asdict(self),
            "model_type": "bert",
            "hidden_act": "gelu",
            "position_embedding_type": "absolute",
        }


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        x = x + self.token_type_embeddings(token_type_ids)  # (..., H)
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention with a key padding mask, then output projection, residual, LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention_dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor
    ) -> torch.Tensor:
        """softmax(q k^T / sqrt(hs) + M) v for (B, T, H) inputs; key_mask (B, T) is 1 for real tokens."""
        B, T, H = q.shape

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(B, T, self.n_heads, self.head_size).transpose(1, 2)  # (B, nh, T, hs)

        q, k, v = heads(q), heads(k), heads(v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_size)  # (B, nh, T, T)
        scores = scores.masked_fill(key_mask[:, None, None, :] == 0, float("-inf"))
        probs = self.attention_dropout(torch.softmax(scores, dim=-1))
        return (probs @ v).transpose(1, 2).reshape(B, T, H)  # (B, T, H)

    def forward(self, h: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        context = self.attend(self.query(h), self.key(h), self.value(h), key_mask)
        return self.LayerNorm(h + self.dropout(self.dense(context)))


def fused_attention(
    attention: SelfAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor
) -> torch.Tensor:
    """The same softmax(q k^T / sqrt(hs) + M) v as ``SelfAttention.attend``, in PyTorch's fused
    scaled_dot_product_attention kernel (no (B, nh, T, T) score tensor in memory)."""
    B, T, H = q.shape
    nh, hs = attention.n_heads, attention.head_size

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)

    dropout = attention.attention_dropout.p if attention.training else 0.0
    out = F.scaled_dot_product_attention(
        heads(q), heads(k), heads(v), attn_mask=key_mask[:, None, None, :].bool(), dropout_p=dropout
    )
    return out.transpose(1, 2).reshape(B, T, H)


class FeedForward(nn.Module):
    """Position-wise GELU feed-forward, residual, LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        inner = F.gelu(self.intermediate(a))  # (..., intermediate), exact erf GELU
        return self.LayerNorm(a + self.dropout(self.output(inner)))


class Layer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(config)
        self.feed_forward = FeedForward(config)

    def forward(self, h: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        return self.feed_forward(self.attention(h, key_mask))


class Bert(nn.Module):
    """The encoder: embeddings and ``num_hidden_layers`` post-LN Transformer layers."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """All hidden states, ``(n_layers + 1, B, T, H)``; index 0 is the embedding output."""
        B, T = input_ids.shape
        if self.config.max_position_embeddings < T:
            raise OptionError(
                f"{T} tokens exceed max_position_embeddings={self.config.max_position_embeddings}"
            )
        token_type_ids = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        positions = torch.arange(T, device=input_ids.device).expand(B, T)
        h = self.embeddings(input_ids, token_type_ids, positions)  # (B, T, H)
        states = [h]
        for layer in self.layers:
            h = layer(h, attention_mask)
            states.append(h)
        return torch.stack(states)

    def forward_packed(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """All hidden states of a packed batch: ``input_ids`` (N,) holds the sequences back to back,
        ``lengths`` (B,) their lengths. Returns ``(n_layers + 1, N, H)``."""
        B, T = len(lengths), int(lengths.max())
        starts = torch.cumsum(lengths, 0) - lengths  # (B,)
        # where each packed token sits in the padded (B, T) grid, for the attention blocks only
        row = torch.repeat_interleave(torch.arange(B, device=input_ids.device), lengths)  # (N,)
        col = torch.arange(len(input_ids), device=input_ids.device) - starts[row]  # (N,) = position
        key_mask = torch.arange(T, device=input_ids.device)[None, :] < lengths[:, None]  # (B, T)
        h = self.embeddings(input_ids, token_type_ids, col)  # (N, H)
        states = [h]
        for layer in self.layers:
            attention: Any = layer.attention  # (typed SelfAttention; nn.Module.__getattr__ hides it)
            q, k, v = attention.query(h), attention.key(h), attention.value(h)  # (N, H) each

            def grid(x: torch.Tensor) -> torch.Tensor:
                padded = x.new_zeros(B, T, x.shape[-1])
                padded[row, col] = x
                return padded  # (B, T, H)

            context = fused_attention(attention, grid(q), grid(k), grid(v), key_mask)[row, col]  # (N, H)
            a = attention.LayerNorm(h + attention.dropout(attention.dense(context)))
            h = cast(Layer, layer).feed_forward(a)
            states.append(h)
        return torch.stack(states)

    # ------------------------------------------------------------------ weights from Hugging Face
    @classmethod
    def from_hf(cls, source: nn.Module | str | os.PathLike) -> Bert:
        """Copy a Hugging Face BertModel (an instance, or a folder holding one), key by key with
        shape checks."""
        if isinstance(source, str | os.PathLike):
            path = Path(source)
            if not (path / "config.json").is_file():
                raise ModelLoadError(
                    f"{str(path)!r} has no config.json; pass a Hugging Face BERT model folder"
                )
            from transformers import AutoModel

            source = AutoModel.from_pretrained(path)
        hf_model: Any = source
        hf_config = hf_model.config
        if getattr(hf_config, "model_type", None) != "bert":
            raise ModelLoadError(f"Bert.from_hf copies BERT weights; got model type {hf_config.model_type!r}")
        if getattr(hf_config, "position_embedding_type", "absolute") != "absolute":
            raise ModelLoadError("only absolute position embeddings are implemented")
        config = BertConfig.from_dict(hf_config.to_dict())
        model = cls(config)
        model.load_state_dict(_hf_to_reference(hf_model.state_dict(), model.state_dict()))
        return model.eval()


def _hf_key(key: str) -> str:
    """Reference parameter name -> Hugging Face BertModel name."""
    if key.startswith("embeddings."):
        return key
    parts = key.split(".")  # layers.{i}.{block}.{name}.{weight|bias}
    i, block, rest = parts[1], parts[2], ".".join(parts[3:])
    prefix = f"encoder.layer.{i}."
    table = {
        ("attention", "query"): "attention.self.query",
        ("attention", "key"): "attention.self.key",
        ("attention", "value"): "attention.self.value",
        ("attention", "dense"): "attention.output.dense",
        ("attention", "LayerNorm"): "attention.output.LayerNorm",
        ("feed_forward", "intermediate"): "intermediate.dense",
        ("feed_forward", "output"): "output.dense",
        ("feed_forward", "LayerNorm"): "output.LayerNorm",
    }
    name, leaf = rest.rsplit(".", 1)
    return prefix + table[(block, name)] + "." + leaf


def _hf_to_reference(hf_state: dict, ours: dict) -> dict:
    hf_state = {k.removeprefix("bert."): v for k, v in hf_state.items()}
    out = {}
    for key, target in ours.items():
        name = _hf_key(key)
        if name not in hf_state:
            raise ModelLoadError(f"weight {name!r} (for {key}) is missing from the Hugging Face model")
        if tuple(hf_state[name].shape) != tuple(target.shape):
            raise ModelLoadError(
                f"{name}: shape {tuple(hf_state[name].shape)} does not fit {key} {tuple(target.shape)}"
            )
        out[key] = hf_state[name].detach().clone().to(target.dtype)
    return out


def reference_to_hf(state: dict) -> dict:
    """Reference parameter names -> Hugging Face BertModel names (for saving)."""
    return {_hf_key(k): v for k, v in state.items()}


def save_config(config: BertConfig, folder: Path, architectures: list[str]) -> None:
    data = {**config.to_hf_dict(), "architectures": architectures}
    (folder / "config.json").write_text(json.dumps(data, indent=2) + "\n")
