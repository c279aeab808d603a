"""The layer explorer: a static page at ``/`` and the ``/v1/explore/*`` endpoints it calls.

Each endpoint returns what a function of :mod:`layerwise.explore` returns for the same input, so the
page and a Python session show the same numbers. Model work runs in the thread pool; the engine's
lock serialises it with the batcher's runs. Reference sets (the built-in UD EWT sample, or the
``--store`` given at start) and masked-LM heads are built once per model, on first use.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from fastapi import FastAPI
from fastapi.responses import FileResponse
from pydantic import Field
from starlette.concurrency import run_in_threadpool
from starlette.staticfiles import StaticFiles

from ..errors import LayerwiseError, OptionError
from ..inputs.display import token_display
from .responses import ApiError, b64_array, json_response
from .schemas import _Strict, error_responses

EXPLORE_ERRORS = (401, 404, 413, 422, 429, 500, 503)

if TYPE_CHECKING:
    from ..encoder import Encoder
    from ..explore import CausalLMHead, MaskedLMHead, ReferenceSet
    from .batcher import Batcher

STATIC = Path(str(resources.files("layerwise.explore").joinpath("static")))
# The page runs only its own script and talks only to this server: an injected tag or handler
# would not run even if escaping failed somewhere (the page itself never parses user text as HTML).
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


class TextRequest(_Strict):
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


class ProjectionRequest(_Strict):
    model: str | None = None
    words: list[Annotated[str, Field(pattern=r"\S")]] = Field(
        min_length=1, max_length=20, description="Words to place (each with a non-space character)"
    )
    projection: Literal["pca", "tsne", "umap"] = "pca"


class Explorer:
    """Per served model: its reference set and masked-LM head, built once on first use."""

    def __init__(self, store: str | os.PathLike | None = None, store_model: str | None = None) -> None:
        self.store, self.store_model = store, store_model
        self._references: dict[str, ReferenceSet] = {}
        self._heads: dict[str, MaskedLMHead | CausalLMHead | None] = {}
        self._lock = threading.Lock()

    def reference(self, name: str, encoder: Encoder) -> ReferenceSet:
        from ..explore import ReferenceSet

        with self._lock:
            if name not in self._references:
                if self.store is not None and self.store_model == encoder.name:
                    self._references[name] = ReferenceSet.from_store(self.store)
                else:
                    self._references[name] = ReferenceSet.sample(encoder)
            return self._references[name]

    def head(self, name: str, encoder: Encoder) -> MaskedLMHead | CausalLMHead | None:
        from ..explore import load_lens_head

        with self._lock:
            if name not in self._heads:
                self._heads[name] = load_lens_head(encoder)
            return self._heads[name]


def add_explorer(
    app: FastAPI,
    *,
    models: dict,
    pick: Callable[[str | None], Any],
    run: Callable[..., Any],
    batcher: Batcher,
    max_tokens: int,
    store: str | os.PathLike | None = None,
) -> None:
    """Mount the page and its endpoints on ``app`` (see the module docstring). ``store`` must be a
    token-level store written by one of the served models (checked here, before serving)."""
    store_model = _store_model(store, {served.name for served in models.values()}) if store else None
    explorer = Explorer(store, store_model)

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": CSP})

    app.mount("/explore", StaticFiles(directory=STATIC), name="explore-static")

    async def compute(function: Callable, *args):
        return await run_in_threadpool(function, *args)  # errors: the service's one mapping

    async def stack_of(served: Any, body: TextRequest):
        """Every hidden state of the request's text (windows past the model's length), through the
        batcher; a text over ``max_tokens`` is a 413 naming the limit."""
        raw = _text_inputs(body)
        results, _, _ = await run(served, raw, None, bytes_per_value=0, window=True, max_tokens=max_tokens)
        return results[0]

    def bounded(encoder: Encoder, body: TextRequest):
        """Admission for the side work on ``body``'s text (see the module docstring)."""
        return batcher.side_work(_check_size(encoder, body, max_tokens))

    @app.get(
        "/v1/explore/info",
        summary="Explorer: served models, what each view can show",
        response_model=dict[str, Any],
        responses=error_responses(401, 404, 422, 500),
    )
    async def info():
        from ..analysis.plot import PROJECTIONS

        entries = []
        for name, served in models.items():
            if name != served.name:
                continue  # aliases
            enc = served.encoder
            head = await compute(explorer.head, name, enc)
            entries.append(
                {
                    "id": name,
                    "n_hidden_states": enc.n_hidden_states,
                    "n_heads": int(enc.config.num_attention_heads),
                    "hidden_size": enc.hidden_size,
                    "max_length": enc.max_length,
                    "lens": head is not None,
                    "mask_token": enc.tokenizer.mask_token,
                    "decoder": enc.is_decoder,  # its lens reads the next token, no [MASK] needed
                    "final_norm": enc.final_norm if enc.is_decoder else None,  # the views' hidden states
                    "reference": "store" if store_model == enc.name else "sample",
                }
            )
        return {"models": entries, "projections": [p for p in PROJECTIONS if _installed(p)]}

    @app.post(
        "/v1/explore/tokens",
        summary="Explorer grid: per token and layer, the token_statistics",
        response_model=dict[str, Any],
        responses=error_responses(*EXPLORE_ERRORS),
    )
    async def tokens(body: TextRequest):
        from ..explore import token_statistics

        served = pick(body.model)
        stack = await stack_of(served, body)

        def work():
            stats = token_statistics(stack)
            return {
                "model": served.name,
                **_token_fields(stack, _shown(served.encoder)),
                "statistics": {name: _nullable(values) for name, values in stats.items()},
            }

        return json_response(await compute(work))

    @app.post(
        "/v1/explore/neighbours",
        summary="Explorer: a token's nearest reference tokens per layer",
        response_model=dict[str, Any],
        responses=error_responses(*EXPLORE_ERRORS),
    )
    async def neighbours(body: NeighboursRequest):
        served = pick(body.model)
        stack = await stack_of(served, body)

        def work():
            if body.token >= stack.n_tokens:
                raise ApiError(
                    422, f"token {body.token} is past the text's {stack.n_tokens} tokens", param="token"
                )
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

        return json_response(await compute(work))

    @app.post(
        "/v1/explore/attention",
        summary="Explorer: every head's attention at one layer",
        response_model=dict[str, Any],
        responses=error_responses(*EXPLORE_ERRORS),
    )
    async def attention(body: AttentionRequest):
        from ..explore import attention_maps

        served = pick(body.model)
        n_layers = served.encoder.n_layers
        if body.layer > n_layers:
            raise ApiError(
                422, f"layer {body.layer} out of range: this model has layers 1 … {n_layers}", param="layer"
            )

        def work():
            with bounded(served.encoder, body):
                stack, maps = attention_maps(served.encoder, body.text, body.text_pair)
            return {
                "model": served.name,
                **_token_fields(stack, _shown(served.encoder)),
                "layer": body.layer,
                "attention": b64_array(maps[body.layer - 1], "float32"),
            }

        return json_response(await compute(work))

    @app.post(
        "/v1/explore/lens",
        summary="Explorer: each layer's top predictions for [MASK], or a decoder's next token (logit lens)",
        response_model=dict[str, Any],
        responses=error_responses(*EXPLORE_ERRORS),
    )
    async def lens(body: LensRequest):
        from ..explore import logit_lens

        served = pick(body.model)

        def work():
            head = explorer.head(served.name, served.encoder)
            if head is None:
                what = "causal-LM head" if served.encoder.is_decoder else "masked-LM head"
                raise ApiError(422, f"model {served.name!r} has no {what} in its checkpoint: no logit lens")
            with bounded(served.encoder, body):
                found = logit_lens(served.encoder, body.text, k=body.k, head=head)
            return {"model": served.name, **found}

        return json_response(await compute(work))

    @app.post(
        "/v1/explore/projection",
        summary="Explorer: layerwise plot's per-layer projection, as data",
        response_model=dict[str, Any],
        responses=error_responses(*EXPLORE_ERRORS),
    )
    async def projection(body: ProjectionRequest):
        from ..explore import word_projection

        served = pick(body.model)

        def work():
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

        return json_response(await compute(work))

    @app.get(
        "/v1/explore/similarity",
        summary="Explorer: linear CKA between layers over the reference set",
        response_model=dict[str, Any],
        responses=error_responses(401, 404, 422, 500),
    )
    async def similarity(model: str | None = None):
        served = pick(model)

        def work():
            reference = explorer.reference(served.name, served.encoder)
            return {
                "model": served.name,
                "reference": reference.name,
                "layers": list(reference.layers),
                "cka": np.round(reference.similarity, 6).tolist(),
            }

        return json_response(await compute(work))


# ---------------------------------------------------------------------------------------------- helpers
def _store_model(store: str | os.PathLike, served: set[str]) -> str:
    """The model that wrote ``store``, once the store is known to be usable as a reference set."""
    from ..explore import ReferenceSet

    model = ReferenceSet.from_store(store, max_tokens=1).model  # checks level and layers up front
    if model not in served:
        raise OptionError(
            f"--store {str(store)!r} was written by {model!r}, which is not served here "
            f"(serving {', '.join(sorted(served))}): add --model {model}"
        )
    return model


def _installed(projection: str) -> bool:
    import importlib.util

    module = {"pca": "sklearn", "tsne": "sklearn", "umap": "umap"}[projection]
    return importlib.util.find_spec(module) is not None


def _text_inputs(body: TextRequest):
    """The request's text (and pair) as inputs; a text that cannot be one is a 422 on ``text``."""
    from ..inputs.encoding import normalize_inputs

    pairs = None if body.text_pair is None else [body.text_pair]
    try:
        return normalize_inputs([body.text], text_pairs=pairs)
    except LayerwiseError as exc:
        raise ApiError(422, str(exc), param="text") from None


def _check_size(encoder: Encoder, body: TextRequest, max_tokens: int) -> int:
    """The text's tokens (tokenising 100,000 characters takes milliseconds), or a 413 beyond
    ``max_tokens``."""
    n_tokens = len(encoder.inputs.encode(_text_inputs(body), truncate=False)[0])  # all, not a first window
    if n_tokens > max_tokens:
        raise ApiError(
            413,
            f"the text has {n_tokens:,} tokens; the explorer takes at most {max_tokens:,} "
            "(--max-explore-tokens)",
            code="too_many_tokens",
        )
    return n_tokens


def _shown(encoder) -> Callable[[str], str]:
    """The tokenizer's pieces as a person reads them (``" capital"``, not ``"Ġcapital"``), as the
    lens and ``layerwise show`` print them (inputs/display.py); made once per tokenizer."""
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


def _nullable(values: np.ndarray) -> list:
    """Nested lists with NaN as None (JSON has no NaN)."""
    return [[None if np.isnan(v) else float(v) for v in row] for row in values]


def _neighbour(n, shown: Callable[[str], str]) -> dict:
    return {
        "cosine": n.cosine, "text": n.text, "token": shown(n.token_text), "piece": n.token_text,
        "start": n.start, "end": n.end,
    }  # fmt: skip


def _site(reference: ReferenceSet, s: int, segment: int, start: int, end: int) -> dict:
    return {"text": reference.stacks[s].segment_text(segment), "start": start, "end": end}
