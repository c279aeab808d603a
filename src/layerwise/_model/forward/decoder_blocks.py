"""A decoder LM's blocks (and ModernBERT's), run one at a time on a packed batch: the adapter that
the layer loop (layer_loop.py) runs in memory (packed_decoder.py) and streamed
(streaming/decoder.py) alike.

A batch's residual stream is ``(N, H)`` between layers, its real tokens back to back; each block
runs it as a batch of one, ``(1, N, H)``, with position ids that restart at 0 for each text and the
batch's attention grids passed down to the packed attention (packed_attention.py). The embeddings
are the word table, with what the family's model forward adds to it: learned positions (GPT-2's
``wpe``, OPT's ``embed_positions``, which adds its offset of 2 itself), OPT's ``project_in``,
ModernBERT's embedding norm (its whole ``embeddings`` module); Gemma's scale is inside its word
table. Rotary positions are computed once per batch from the model's ``rotary_emb`` (one per layer
type for Gemma 3 and ModernBERT). Every state stays raw: the engine applies the final norm a call
asks for (final_norm.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..families.kinds import is_decoder_config
from ..families.table import family
from .packed import AttentionGroup, plan_groups
from .packed_attention import ATTENTION, GROUPS

# one block's step on one batch: (its hidden state (N, H), its prepared batch, what it carries) -> (N, H)
Step = Callable[[torch.Tensor, Any, Any], torch.Tensor]


@dataclass
class PackedDecoderBatch:
    ids: torch.Tensor  # (N,)
    positions: torch.Tensor  # (N,) 0 … n-1 for each text
    lengths: list[int]
    groups: list[AttentionGroup]


def prepare_decoder_batch(columns: Any, device: torch.device, *, causal: bool = True) -> PackedDecoderBatch:
    """A batch's ids back to back (_inputs/block.py ``TokenColumns``), each text's positions, its
    attention grids. Causal attention needs no key mask (a real token's window ends before any
    padding); an encoder's does."""
    column, groups = plan_groups(columns.lengths, device, key_mask=not causal)
    return PackedDecoderBatch(
        torch.from_numpy(columns.ids).to(device), column.to(device), columns.lengths, groups
    )


def decoder_layers(model: Any) -> Any:
    """The layer list of ``model``, where its family's row says (``layers`` for Llama and the
    others, ``h`` for GPT-2, ``decoder.layers`` for OPT); None where it is not there."""
    row = family(getattr(model.config, "model_type", None))
    found: Any = model
    for part in (row.layers if row is not None and row.layers else "layers").split("."):
        found = getattr(found, part, None)
    return found


class DecoderBlocks:
    """The embeddings, blocks and rotary positions of ``model``, a transformers base model (the
    user's, through a replica: replica.py; or a streamed skeleton) whose config runs the packed
    attention."""

    def __init__(self, model: Any) -> None:
        config = model.config
        if config._attn_implementation != ATTENTION:
            raise AssertionError("the blocks run on a model whose config calls the packed attention")
        self.model, self.layers = model, list(decoder_layers(model))
        self.causal = is_decoder_config(config)  # else ModernBERT: attention both ways
        inner = getattr(model, "decoder", model)  # OPT keeps its parts under ``decoder``
        self.words = model.get_input_embeddings()
        # ModernBERT's embeddings module norms the words it looks up: it runs whole
        self.embeddings = None if self.causal else model.embeddings
        self.positions = getattr(model, "wpe", None) or getattr(inner, "embed_positions", None)
        self.project_in = getattr(inner, "project_in", None)  # OPT-350m: words narrower than the stream
        row = family(config.model_type)
        per_type = row is not None and row.positions == "rotary per layer type"
        self.layer_types = getattr(config, "layer_types", None) if per_type else None
        rotary = getattr(model, "rotary_emb", None) is not None
        self.rotary_kinds = len(set(self.layer_types or [None])) if rotary else 0

    def embedding_modules(self) -> list[Any]:
        """The modules the embeddings read (a streamed model loads them as its first unit)."""
        if self.embeddings is not None:
            return [self.embeddings]
        parts = [self.words, self.positions, self.project_in]
        return [m for m in parts if m is not None]

    def prepare(self, columns: Any, device: torch.device) -> PackedDecoderBatch:
        return prepare_decoder_batch(columns, device, causal=self.causal)

    def embed(self, batch: PackedDecoderBatch, ids: torch.Tensor) -> torch.Tensor:
        """The embedding output ``(N, H)`` of ``ids`` (the batch's, or their rows in a streamed block's
        word table); learned positions restart at each text, as the batch numbers them."""
        if self.embeddings is not None:
            return self.embeddings(input_ids=ids)
        hidden = self.words(ids)
        if self.project_in is not None:
            hidden = self.project_in(hidden)
        if self.positions is None:
            return hidden
        if hasattr(self.positions, "offset"):  # OPT's: positions from ids, its offset added inside
            return hidden + self.positions(None, position_ids=batch.positions)
        return hidden + self.positions(batch.positions)

    def carried(self, hidden: torch.Tensor, batch: PackedDecoderBatch) -> Any:
        """The rotary embedding of the batch's positions: one, or one per layer type (Gemma 3,
        ModernBERT); None without rotary positions (GPT-2, OPT)."""
        if not self.rotary_kinds:
            return None
        rotary, positions = self.model.rotary_emb, batch.positions[None]
        if self.layer_types is None:
            return rotary(hidden, positions)
        return {kind: rotary(hidden, positions, kind) for kind in set(self.layer_types)}

    def layer_step(self, depth: int) -> Step:
        """Block ``depth`` (1 … n) on one batch."""
        layer = self.layers[depth - 1]
        kind = None if self.layer_types is None else self.layer_types[depth - 1]
        causal = self.causal

        def step(hidden: torch.Tensor, batch: PackedDecoderBatch, rotary: Any) -> torch.Tensor:
            rotary = rotary if kind is None else rotary[kind]
            given: dict[str, Any] = {GROUPS: batch.groups}
            if rotary is not None:
                given["position_embeddings"] = rotary
            if causal:
                given["use_cache"] = False
            out = layer(hidden[None], attention_mask=None, position_ids=batch.positions[None], **given)
            return out[0]

        return step
