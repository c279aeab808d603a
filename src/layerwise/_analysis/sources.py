"""Where the label-free metrics read token states from, and how an Encoder reads its texts for them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from ..errors import InputError, OptionError

if TYPE_CHECKING:
    from typing import Unpack

    from .._settings.long_texts import LongTexts
    from .._settings.settings import FinalNorm, Method


class TokenPassOptions(TypedDict, total=False):
    """How an Encoder source reads its texts for a metric: the keywords of ``Encoder.iter_extract``
    that leave every hidden state of every token as it is (a test holds them to its parameters).

    long_texts, stride: truncate or slide windows over inputs past ``max_length``; batch_size,
    max_tokens: the batches (the Encoder's by default); final_norm: a decoder's final norm; method:
    output_hidden_states or hooks (the same numbers); progress: the progress bar."""

    long_texts: LongTexts
    stride: int | None
    batch_size: int | None
    max_tokens: int | None
    final_norm: FinalNorm | None
    method: Method | None
    progress: bool | None


def token_stacks(
    source: Any, texts: Sequence[str] | None = None, **reading: Unpack[TokenPassOptions]
) -> Iterator[Any]:
    """LayerStacks (token level, every hidden state) of a source: LayerStacks, a token-level store,
    or an Encoder with ``texts`` (extracted in one streaming pass, read as ``reading`` says)."""
    from ..store._reader import Store

    if hasattr(source, "iter_extract"):
        if texts is None:
            raise OptionError("an Encoder source needs texts: layer_metrics(enc, texts)")
        for _, stack in source.iter_extract(list(texts), layers="all", **reading):
            yield stack
        return
    if texts is not None:
        raise OptionError("texts go with an Encoder source; stacks and stores hold their own")
    if isinstance(source, Store) and source.level != "token":
        raise InputError(
            f"a {source.level}-level store holds no token vectors; the label-free metrics read a "
            "token-level store (layerwise extract ... --pool token)"
        )
    for item in source:
        if not hasattr(item, "hidden") or np.ndim(item.hidden) != 3:
            raise InputError(
                f"cannot compute layer metrics of {type(item).__name__}; pass LayerStacks "
                "(enc.extract(texts, layers='all')), a token-level store, or an Encoder and texts"
            )
        yield item
