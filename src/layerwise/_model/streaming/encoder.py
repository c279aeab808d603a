"""A BERT-family encoder, streamed: the light model's modules (loading/light.py) as the skeleton, and
the packed forward's own embeddings and layer function (forward/packed.py), so the numbers are the
in-memory packed forward's."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import torch

from ..forward.packed import PackedEncoder
from ..loading.light import LightModel
from .checkpoint import Weights
from .model import Step, StreamedModel


class StreamedEncoder(StreamedModel):
    """The embeddings (and ELECTRA's projection) as the first unit, then each layer."""

    def __init__(
        self,
        config: Any,
        checkpoint: Weights,
        prefix: str,
        dtype: torch.dtype,
        device: torch.device,
        *,
        pooler: bool,
    ) -> None:
        skeleton = LightModel(config, pooler=pooler)  # every weight on the meta device
        self.packed = PackedEncoder(skeleton)
        first = [
            skeleton.embeddings,
            *([skeleton.embeddings_project] if self.packed.project is not None else []),
        ]
        units = [first, *[[layer] for layer in self.packed.layers]]
        words = skeleton.embeddings.word_embeddings
        super().__init__(skeleton, units, words, checkpoint, prefix, dtype, device)

    def prepare(self, columns: Any, *, with_token_types: bool, device: torch.device) -> Any:
        return self.packed.prepare(columns, with_token_types=with_token_types, device=device)

    def embed(self, batch: Any, vocabulary: torch.Tensor) -> torch.Tensor:
        return self.packed.embed(replace(batch, ids=self.renumbered(batch.ids, vocabulary)))

    def layer_step(self, depth: int) -> Step:
        run = partial(self.packed.run_layer, self.packed.layers[depth - 1])
        return lambda hidden, batch, carried: run(hidden, batch)

    def after_layer(self, depth: int) -> None:
        if depth:
            self.packed.forget(self.packed.layers[depth - 1])
