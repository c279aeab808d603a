"""A decoder LM (the families the packed decoder forward runs), and ModernBERT, streamed: the same
blocks as in memory (forward/decoder_blocks.py) on a skeleton of our own whose config calls the
packed attention, the embeddings as the first unit and each layer as one; the final norm is read
once, whole. Every state stays raw: the engine applies the final norm a call asks for
(final_norm.py)."""

from __future__ import annotations

from typing import Any

import torch

from ...errors import ModelLoadError
from ..final_norm import final_norm_module
from ..forward.decoder_blocks import DecoderBlocks, decoder_layers
from ..forward.packed_attention import packed_config
from .checkpoint import Weights
from .model import Step, StreamedModel, unit_names


class StreamedDecoder(StreamedModel):
    """The embeddings (GPT-2's learned positions with them) as the first unit, then each layer; the
    final norm read once, whole (the engine applies it where a call asks)."""

    def __init__(
        self, config: Any, checkpoint: Weights, name: str, dtype: torch.dtype, device: torch.device
    ) -> None:
        from transformers import AutoModel

        with torch.device("meta"):  # a skeleton of ours, on a config of ours: the packed attention
            skeleton = AutoModel.from_config(packed_config(config), dtype=dtype).eval()  # no dropout
        layers = decoder_layers(skeleton)
        prefix = _prefix(skeleton, layers, checkpoint.names(), name)
        words = skeleton.get_input_embeddings()
        rotary = getattr(skeleton, "rotary_emb", None)
        # buffers computed at construction (the rotary frequencies, Gemma's embedding scale) must be
        # real numbers
        if rotary is not None:
            skeleton.rotary_emb = type(rotary)(skeleton.config).to(device)
        if hasattr(words, "embed_scale"):  # Gemma's embeddings times sqrt(hidden)
            words.embed_scale = torch.tensor(float(config.hidden_size) ** 0.5, device=device)
        self.blocks = DecoderBlocks(skeleton)
        self.causal, self.rotary_kinds = self.blocks.causal, self.blocks.rotary_kinds
        found = final_norm_module(skeleton)  # None: no final norm (OPT with do_layer_norm_before=False)
        final_norm = [] if found is None else [prefix + n for n in unit_names(skeleton, [found])]
        norm = checkpoint.read(final_norm, dtype, device)
        skeleton.load_state_dict({k[len(prefix) :]: v for k, v in norm.items()}, strict=False, assign=True)
        self.layers = self.blocks.layers
        # the layers' linears run F.linear, not the in-memory forward's prepacked oneDNN copies: a
        # packed copy of the running layer and oneDNN's primitive caches (one per batch shape) took
        # 85 MB past the streamed memory bound on an AMD EPYC (benchmarks/streamed_speed.py)
        units = [self.blocks.embedding_modules(), *[[layer] for layer in self.layers]]
        super().__init__(skeleton, units, words, checkpoint, prefix, dtype, device)

    def prepare(self, columns: Any, *, with_token_types: bool = False, device: torch.device) -> Any:
        return self.blocks.prepare(columns, device)

    def embed(self, batch: Any, vocabulary: torch.Tensor) -> torch.Tensor:
        return self.blocks.embed(batch, self.renumbered(batch.ids, vocabulary))

    def carried(self, hidden: torch.Tensor, batch: Any) -> Any:
        return self.blocks.carried(hidden, batch)

    def layer_step(self, depth: int) -> Step:
        return self.blocks.layer_step(depth)


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
