"""Packed (unpadded) forward for decoder LMs (and ModernBERT), in memory: the one layer loop
(layer_loop.py) over the blocks of a replica of the user's model (replica.py), the weights resident.

A batch's real tokens run back to back as one sequence, with position ids that restart at 0 for
each text (so rotary or learned positions are each text's own). Everything but attention is
transformers' own code, op for op: embeddings (Gemma's scaling included), norms, rotary positions,
the feed-forward, Qwen 3's query/key norms (decoder_blocks.py); attention runs over per-text grids
(packed_attention.py). The loop stops after the deepest layer asked for. The blocks' linear layers
run on oneDNN with prepacked weights where that wins (cpu_gemm.py), and the sub-layer taps
(``attn_out``, ``mlp_out``) are recorded by hooks on the replica. The user's model is left as it
was: no hook, patch or attribute is put on it, and its config keeps its attention implementation.

Supported: the Llama, Mistral, Qwen2/Qwen3, Gemma/Gemma2/Gemma3, Phi/Phi-3 and OLMo/OLMo 2 families
(``nn.Linear`` projections, ``layers``, rotary positions), GPT-2 (``h``, learned positions; its
``Conv1D`` projections stay transformers' own), GPT-NeoX, OPT (``decoder.layers``) and ModernBERT.
Per-layer sliding windows (Gemma 3, Qwen with ``use_sliding_window``) come with each layer's
attention call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..families.kinds import is_decoder_config
from ..families.table import family, packed_families
from .cpu_gemm import PrepackedLinears
from .decoder_blocks import DecoderBlocks, PackedDecoderBatch, decoder_layers, prepare_decoder_batch
from .hooks import tap_module, tap_paths
from .layer_loop import Resident, run_block
from .packed import PackedEncoder
from .replica import Replica, Replicas, packed_replica, prepack_linears

PACKED_TAPS = ("attn_out", "mlp_out")  # the sub-layer outputs the packed forward records
# the families run block by block (their rows of the family table say "blocks"): decoders, and
# encoders whose layers call transformers' attention interface, packed the same way with attention
# both ways over each text's grid (ModernBERT's local layers: within their window)
PACKED_DECODER_TYPES = packed_families("blocks", "decoder")
PACKED_ENCODER_TYPES_ON_MODULES = packed_families("blocks", "encoder")


def runs_on_modules(config: Any) -> bool:
    """Whether ``config``'s model runs this module's way (its own modules, the packed attention):
    every decoder LM, and the encoders whose family runs block by block. Among those,
    :func:`unpackable_decoder` says which families it runs."""
    row = family(config.model_type)
    return is_decoder_config(config) or (row is not None and row.forward == "blocks")


def unpackable_decoder(config: Any) -> str | None:
    """What in ``config`` the packed decoder forward cannot run, or None when it can."""
    row = family(config.model_type)
    if row is None or row.forward != "blocks":
        return f"model type {config.model_type!r}"
    return None


class ResidentDecoder(Replica, Resident):
    """A replica's blocks with their weights in memory, as the layer loop runs them (layer_loop.py's
    Resident: a block of texts is one batch, and nothing is loaded or released)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.blocks = DecoderBlocks(model)

    def embed(self, batch: PackedDecoderBatch, vocabulary: Any) -> torch.Tensor:
        return self.blocks.embed(batch, batch.ids)

    def carried(self, hidden: torch.Tensor, batch: PackedDecoderBatch) -> Any:
        return self.blocks.carried(hidden, batch)

    def layer_step(self, depth: int) -> Any:
        return self.blocks.layer_step(depth)


class PackedDecoder:
    """The packed forward of a transformers decoder model (``LlamaModel``, …): its blocks, on
    replicas of it."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.model_type: str = model.config.model_type
        self.causal = is_decoder_config(model.config)  # else an encoder's layers (ModernBERT)
        self.linear = PrepackedLinears()  # one for every replica: each weight packed once
        self._replicas = Replicas(model, self._replica)

    @classmethod
    def build(cls, model: Any) -> PackedDecoder | None:
        config = getattr(model, "config", None)
        if config is None or unpackable_decoder(config) is not None:
            return None
        if not isinstance(decoder_layers(model), nn.ModuleList):
            return None
        return cls(model)

    def _replica(self) -> ResidentDecoder:
        replica = ResidentDecoder(packed_replica(self.model))
        layers = replica.blocks.layers
        prepack_linears(layers, self.linear)
        available = tap_paths(self.model_type)
        for depth, layer in enumerate(layers, start=1):
            for tap in PACKED_TAPS:  # what the block's attention and feed-forward add to the stream
                if tap in available:  # else refused by name when a call asks for it
                    replica.record_into(tap_module(layer, self.model_type, tap), tap, depth)
        return replica

    def follow(self, state: list[int]) -> None:
        """New replicas where the model's ``state`` changed since they were built (replica.model_state)."""
        self._replicas.follow(state)

    def prepare(
        self, columns: Any, *, device: torch.device, with_token_types: bool = False
    ) -> PackedDecoderBatch:
        """The batch's ids back to back (_inputs/block.py ``TokenColumns``), each text's positions, its
        attention grids (decoders have no token types: ``with_token_types`` is there for the engine's
        one call)."""
        return prepare_decoder_batch(columns, device, causal=self.causal)

    def forward(self, batch: PackedDecoderBatch, layers: Sequence[int]) -> torch.Tensor:
        """Hidden states ``layers`` of the packed batch: ``(len(layers), N, H)``, every one the raw
        residual stream (the engine applies the final norm a call asks for: final_norm.py)."""
        return self.forward_with_taps(batch, layers, ())[0]

    def forward_with_taps(
        self, batch: PackedDecoderBatch, layers: Sequence[int], taps: Sequence[str]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`forward`, and the ``taps`` (of :data:`PACKED_TAPS`) of the blocks behind hidden
        states ``layers`` >= 1: ``{tap: (n, N, H)}``, as the replica's hooks record them."""
        with self._replicas.take() as replica, replica.recording(tuple(taps), set(layers)) as tapped:
            hidden = run_block(replica, [batch], layers)[0]
        tap_layers = [i for i in layers if i >= 1]
        taps_out = {t: torch.stack([tapped[t][i] for i in tap_layers]) for t in taps if tap_layers}
        return hidden, taps_out


def packed_forward(model: Any) -> PackedEncoder | PackedDecoder | None:
    """The packed forward of ``model``: the encoders' (packed.py) or the decoders' (this module);
    None where neither runs this architecture."""
    if runs_on_modules(model.config):
        return PackedDecoder.build(model)
    return PackedEncoder.build(model)
