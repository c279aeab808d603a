"""What a request may cost, decided before it joins a run: its inputs and tokens (413), the bytes
of the vectors its response will carry (413), and how a failure inside its run is answered."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import InputError, InputTooLargeError
from ._responses import ApiError

if TYPE_CHECKING:
    from .._encoder import Encoder
    from .._features.plan import OutputPlan
    from .._inputs.raw import RawInputs
    from .._settings.serve import ServeSettings


def tokenise(
    encoder: Encoder,
    raw: RawInputs,
    settings: ServeSettings,
    n_layers: int,
    window: bool,
    limit: tuple[int, str],
) -> list:
    """Tokenise in a worker thread, with the request limits (413)."""
    from .._inputs.windows import check_window_memory

    if len(raw) > settings.max_inputs:
        raise ApiError(
            413,
            f"{len(raw):,} inputs in one request; this server takes at most {settings.max_inputs:,} "
            "(--max-inputs): split them over several requests",
            code="too_many_inputs",
        )
    try:
        if window:
            check_window_memory(raw, n_layers, encoder.hidden_size)
        encoded = encoder.inputs.encode(raw, truncate=not window)
    except InputTooLargeError as exc:
        raise ApiError(413, str(exc), code="input_too_large") from None
    except InputError as exc:
        raise ApiError(422, str(exc), param=raw.field) from None
    n_tokens = sum(len(item) for item in encoded)
    max_tokens, flag = limit
    if n_tokens > max_tokens:
        raise ApiError(
            413,
            f"the inputs have {n_tokens:,} tokens; this server takes at most {max_tokens:,} per request "
            f"({flag}): split them",
            code="too_many_tokens",
        )
    return encoded


def result_values(plan: OutputPlan | None, encoded: list, hidden_size: int, n_hidden: int) -> int:
    """The number of vector values the results of ``encoded`` hold under ``plan``: one row per
    token at token and word level (words never outnumber tokens), one per input at sentence level."""
    if plan is None:
        return sum(len(item) for item in encoded) * n_hidden * hidden_size
    row = int(np.prod(plan.row_shape(hidden_size, n_hidden)))
    rows = len(encoded) if plan.level == "sentence" else sum(len(item) for item in encoded)
    return rows * row


def check_response_size(size: int, max_bytes: int) -> None:
    """A 413 for a response whose vectors would take ``size`` bytes, over ``max_bytes``."""
    if size > max_bytes:
        raise ApiError(
            413,
            f"the response would carry {size / 2**20:,.1f} MiB of vectors; this server answers at "
            f"most {max_bytes / 2**20:,.0f} MiB (--max-response-mb): ask for fewer layers or inputs, "
            "dtype float16, Accept: application/x-npz (3/4 of JSON's size), or write a store "
            "(layerwise extract INPUT -o corpus.lw) for large jobs",
            code="response_too_large",
        )
