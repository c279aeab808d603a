"""The layer explorer's views: what each ``POST /v1/explore/<view>`` computes from its request,
one table (:data:`VIEWS`) that _explorer.py registers as routes. Each view's ``work`` runs in the
thread pool and returns what a function of :mod:`layerwise.explore` returns for the same input."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import Field

from .._inputs.display import token_display
from ._responses import ApiError, b64_array
from ._schemas import StrictModel

if TYPE_CHECKING:
    from .._results import LayerStack
    from ..explore import ReferenceSet

# ``explorer`` below: the served state, serve/explorer.Explorer (reference sets, heads, admission)


class TextRequest(StrictModel):
    model: str | None = None
    text: str = Field(min_length=1, max_length=100_000)
    text_pair: str | None = Field(None, max_length=100_000)


class NeighboursRequest(TextRequest):
    token: int = Field(
        ge=0, description="Index of the token in the text's tokens ([CLS] = 0); past the last one: 422"
    )
    k: int = Field(5, ge=1, le=50)


class AttentionRequest(TextRequest):
    layer: int = Field(ge=1, description="Encoder layer 1..n_layers")


class LensRequest(TextRequest):
    """The logit lens reads the model's language-model head: a model whose checkpoint has none (a
    sentence-embedding model) answers 422 naming it."""

    k: int = Field(5, ge=1, le=50)


class ProjectionRequest(StrictModel):
    model: str | None = None
    words: list[Annotated[str, Field(pattern=r"\S")]] = Field(
        min_length=1, max_length=20, description="Words to place (each with a non-space character)"
    )
    projection: Literal["pca", "tsne", "umap"] = "pca"


def _tokens(explorer: Any, served: Any, body: TextRequest, stack: LayerStack) -> dict:
    from ..explore import token_statistics

    stats = token_statistics(stack)
    return {
        "model": served.name,
        **_token_fields(stack, _shown(served.encoder)),
        "statistics": {name: nullable(values) for name, values in stats.items()},
    }


def _neighbours(explorer: Any, served: Any, body: NeighboursRequest, stack: LayerStack) -> dict:
    if body.token >= stack.n_tokens:
        raise ApiError(422, f"token {body.token} is past the text's {stack.n_tokens} tokens", param="token")
    reference = explorer.reference(served.name, served.encoder)
    rows = [stack.layers.index(layer) for layer in reference.layers]
    found = reference.neighbours(stack.hidden[rows, body.token], k=body.k)
    shown = _shown(served.encoder)
    return {
        "model": served.name,
        "token": body.token,
        "token_text": shown(stack.tokens[body.token]),
        "token_piece": stack.tokens[body.token],
        "reference": reference.name,
        "layers": list(reference.layers),
        "neighbours": [[_neighbour(n, shown) for n in row] for row in found],
    }


def _attention(explorer: Any, served: Any, body: AttentionRequest, stack: None) -> dict:
    from ..explore import attention_maps

    n_layers = served.encoder.n_layers
    if body.layer > n_layers:
        raise ApiError(
            422, f"layer {body.layer} out of range: this model has layers 1 … {n_layers}", param="layer"
        )
    with explorer.bounded(served.encoder, body):
        stack_, maps = attention_maps(served.encoder, body.text, body.text_pair)
    return {
        "model": served.name,
        **_token_fields(stack_, _shown(served.encoder)),
        "layer": body.layer,
        "attention": b64_array(maps[body.layer - 1], "float32"),
    }


def _lens(explorer: Any, served: Any, body: LensRequest, stack: None) -> dict:
    from ..explore import logit_lens

    head = explorer.head(served.name, served.encoder)
    if head is None:
        what = "causal-LM head" if served.encoder.is_decoder else "masked-LM head"
        raise ApiError(422, f"model {served.name!r} has no {what} in its checkpoint: no logit lens")
    with explorer.bounded(served.encoder, body):
        found = logit_lens(served.encoder, body.text, k=body.k, head=head)
    return {"model": served.name, **found}


def _projection(explorer: Any, served: Any, body: ProjectionRequest, stack: None) -> dict:
    from ..explore import word_projection

    reference = explorer.reference(served.name, served.encoder)
    found = word_projection(reference.stacks, body.words, body.projection)
    return {
        "model": served.name,
        "reference": reference.name,
        "projection": body.projection,
        "layers": list(found["layers"]),
        "labels": found["labels"],
        "missing": found["missing"],
        "points": np.round(found["points"], 5).tolist(),
        "sites": [_site(reference, *site) for site in found["sites"]],
    }


@dataclass(frozen=True)
class View:
    """A POST view: its route, its request body, and ``work(explorer, served, body, stack)`` run in
    the thread pool (``stack``: every hidden state of the text, through the batcher, when asked)."""

    name: str
    summary: str
    request: type
    work: Callable[..., dict]
    with_stack: bool = False


VIEWS = (
    View("tokens", "Explorer grid: per token and layer, the token_statistics", TextRequest, _tokens, True),
    View(
        "neighbours",
        "Explorer: a token's nearest reference tokens per layer",
        NeighboursRequest,
        _neighbours,
        True,
    ),
    View("attention", "Explorer: every head's attention at one layer", AttentionRequest, _attention),
    View(
        "lens",
        "Explorer: each layer's top predictions for [MASK], or a decoder's next token (logit lens)",
        LensRequest,
        _lens,
    ),
    View(
        "projection",
        "Explorer: layerwise plot's per-layer projection, as data",
        ProjectionRequest,
        _projection,
    ),
)


# ---------------------------------------------------------------------------------------------- helpers


def _shown(encoder) -> Callable[[str], str]:
    """The tokenizer's pieces as a person reads them (``" capital"``, not ``"Ġcapital"``), as the
    lens and ``layerwise show`` print them (_inputs/display.py); made once per tokenizer."""
    return _display_of(encoder.tokenizer)


@lru_cache(maxsize=16)
def _display_of(tokenizer: Any) -> Callable[[str], str]:
    return token_display(tokenizer)


def _token_fields(stack, shown: Callable[[str], str]) -> dict:
    return {
        "text": stack.text,
        "text_pair": stack.text_pair,
        "tokens": [shown(t) for t in stack.tokens],  # as read; "pieces": the vocabulary's own
        "pieces": list(stack.tokens),
        "offsets": stack.offsets.tolist(),
        "segment_ids": stack.segment_ids.tolist(),
        "layers": list(stack.layers),
        "truncated": stack.truncated,
        "n_windows": stack.n_windows,
    }


def nullable(values: np.ndarray) -> list:
    """Nested lists with NaN as None (JSON has no NaN)."""
    return [[None if np.isnan(v) else float(v) for v in row] for row in values]


def _neighbour(n, shown: Callable[[str], str]) -> dict:
    return {
        "cosine": n.cosine,
        "text": n.text,
        "token": shown(n.token_text),
        "piece": n.token_text,
        "start": n.start,
        "end": n.end,
    }


def _site(reference: ReferenceSet, s: int, segment: int, start: int, end: int) -> dict:
    return {"text": reference.stacks[s].segment_text(segment), "start": start, "end": end}
