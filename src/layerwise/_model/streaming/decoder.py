"""A decoder LM (the families the packed decoder forward runs), and ModernBERT, streamed: each
layer's own forward, with the packed attention (forward/packed_decoder.py) over each batch's
per-text grids (an encoder's both ways, padding masked). A batch's residual stream is ``(N, H)``
between layers, as the BERT encoders'; each layer runs it as a batch of one. The embeddings are the
word table, with learned positions where the family has them (GPT-2's ``wpe``, OPT's
``embed_positions``, which adds its offset of 2 itself) or ModernBERT's embedding norm; rotary
positions are computed once per batch from the model's ``rotary_emb`` (one per layer type for
Gemma 3 and ModernBERT). Every state stays raw: the engine applies the final norm a call asks for
(final_norm.py)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch

from ...errors import ModelLoadError
from ..families import is_decoder_config
from ..final_norm import final_norm_module
from ..forward.packed_decoder import (
    ATTENTION,
    PackedRun,
    attention_implementation,
    decoder_layers,
    prepare_decoder_batch,
    register_packed_attention,
    running_packed,
)
from .checkpoint import Weights
from .model import Step, StreamedModel, unit_names


class StreamedDecoder(StreamedModel):
    """The embeddings (GPT-2's learned positions with them) as the first unit, then each layer; the
    final norm read once, whole (the engine applies it where a call asks)."""

    def __init__(
        self, config: Any, checkpoint: Weights, name: str, dtype: torch.dtype, device: torch.device
    ) -> None:
        from transformers import AutoModel

        register_packed_attention()
        with torch.device("meta"):
            skeleton = AutoModel.from_config(config, dtype=dtype).eval()  # no dropout, as in memory
        layers = decoder_layers(skeleton)
        prefix = _prefix(skeleton, layers, checkpoint.names(), name)
        words = skeleton.get_input_embeddings()
        self.causal = is_decoder_config(config)  # else ModernBERT: attention both ways
        # ModernBERT's embeddings module norms the words it looks up: read and run whole
        self._embeddings = None if self.causal else skeleton.embeddings
        inner = getattr(skeleton, "decoder", skeleton)  # OPT keeps its parts under ``decoder``
        # learned positions (GPT-2's wpe, OPT's embed_positions), read with the word embeddings
        self._positions = getattr(skeleton, "wpe", None) or getattr(inner, "embed_positions", None)
        rotary = getattr(skeleton, "rotary_emb", None)
        # buffers computed at construction (the rotary frequencies, Gemma's embedding scale) must be
        # real numbers
        if rotary is not None:
            skeleton.rotary_emb = type(rotary)(skeleton.config).to(device)
        if hasattr(words, "embed_scale"):  # Gemma's embeddings times sqrt(hidden)
            words.embed_scale = torch.tensor(float(config.hidden_size) ** 0.5, device=device)
        # Gemma 3, ModernBERT: a rotary embedding per layer type (full and sliding attention)
        per_type = config.model_type in ("gemma3_text", "modernbert")
        types = getattr(config, "layer_types", None) if per_type else None
        self._rotary = rotary is not None
        self._layer_types, self.rotary_kinds = types, len(set(types or [None])) if self._rotary else 0
        found = final_norm_module(skeleton)  # None: no final norm (OPT with do_layer_norm_before=False)
        final_norm = [] if found is None else [prefix + n for n in unit_names(skeleton, [found])]
        norm = checkpoint.read(final_norm, dtype, device)
        skeleton.load_state_dict({k[len(prefix) :]: v for k, v in norm.items()}, strict=False, assign=True)
        self.layers = list(layers)
        # the layers' linears run F.linear, not the in-memory forward's prepacked oneDNN copies: a
        # packed copy of the running layer and oneDNN's primitive caches (one per batch shape) took
        # 85 MB past the streamed memory bound on an AMD EPYC (benchmarks/streamed_speed.py)
        embeddings = [words] if self._positions is None else [words, self._positions]
        if self._embeddings is not None:
            embeddings = [self._embeddings]
        units = [embeddings, *[[layer] for layer in self.layers]]
        super().__init__(skeleton, units, words, checkpoint, prefix, dtype, device)

    def prepare(self, columns: Any, *, with_token_types: bool = False, device: torch.device) -> Any:
        return prepare_decoder_batch(columns, device, causal=self.causal)

    def embed(self, batch: Any, vocabulary: torch.Tensor) -> torch.Tensor:
        """GPT-2 adds its learned positions, which restart at each text as the packed forward
        numbers them."""
        ids = self.renumbered(batch.ids, vocabulary)
        if self._embeddings is not None:
            return self._embeddings(input_ids=ids)
        hidden = self.words(ids)
        if self._positions is None:
            return hidden
        if hasattr(self._positions, "offset"):  # OPT's: positions from ids, its offset added inside
            return hidden + self._positions(None, position_ids=batch.positions)
        return hidden + self._positions(batch.positions)

    def carried(self, hidden: torch.Tensor, batch: Any) -> Any:
        """The rotary embedding of the batch's positions: one, or Gemma 3's one per layer type
        (GPT-2, OPT: none)."""
        if not self._rotary:
            return None
        positions = batch.positions[None]
        if self._layer_types is None:
            return self.skeleton.rotary_emb(hidden, positions)
        return {kind: self.skeleton.rotary_emb(hidden, positions, kind) for kind in set(self._layer_types)}

    def layer_step(self, depth: int) -> Step:
        layer = self.layers[depth - 1]
        kind = None if self._layer_types is None else self._layer_types[depth - 1]

        def step(hidden: torch.Tensor, batch: Any, rotary: Any) -> torch.Tensor:
            rotary = rotary if kind is None else rotary[kind]
            given = {} if rotary is None else {"position_embeddings": rotary}
            if self.causal:
                given["use_cache"] = False
            with running_packed(PackedRun(batch.groups)):  # this thread's grids
                out = layer(hidden[None], attention_mask=None, position_ids=batch.positions[None], **given)
            return out[0]

        return step

    def running(self) -> AbstractContextManager[Any]:
        return attention_implementation(self.skeleton.config, ATTENTION)


def _prefix(skeleton: Any, layers: Any, stored: Any, name: str) -> str:
    """Where the checkpoint keeps the decoder: bare, or under its head model's prefix (``model.``,
    ``transformer.``, ``gpt_neox.``), found by the first layer's first weight."""
    probe = unit_names(skeleton, [layers[0]])[0]
    base = getattr(skeleton, "base_model_prefix", "") or ""
    for prefix in ("", f"{base}.", "model.", "transformer."):
        if prefix + probe in stored:
            return prefix
    raise ModelLoadError(
        f"model {name!r}: its checkpoint does not hold the decoder's weights under the model's names "
        f"({probe!r} …); load it in memory (streaming=False), or save it again with "
        "model.save_pretrained(folder)"
    )
