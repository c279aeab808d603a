"""Where a model's learned positions start, read from its own modules: after the padding row of its
position table where it reserves one (RoBERTa's convention, kept by XLM-R, CamemBERT, MPNet,
Longformer, I-BERT, Data2Vec-text, LUKE, X-MOD…), else at 0. The longest input is the table less
that start (source.usable_max_length), and the packed forward numbers its positions from it
(forward/packed.py): one rule for every model type, not a list of types."""

from __future__ import annotations

from typing import Any


def first_position(model: Any) -> int:
    """The first position id of ``model``'s inputs: its position table's padding row + 1 where the
    table has one (an ``nn.Embedding``'s ``padding_idx``, I-BERT's quantised embedding's, the light
    loader's), else 0."""
    table = getattr(getattr(model, "embeddings", None), "position_embeddings", None)
    padding = getattr(table, "padding_idx", None)
    return int(padding) + 1 if isinstance(padding, int) else 0
