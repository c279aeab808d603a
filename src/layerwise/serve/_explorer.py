"""The layer explorer: a static page at ``/`` and the ``/v1/explore/*`` endpoints it calls.

Each endpoint returns what a function of :mod:`layerwise.explore` returns for the same input, so the
page and a Python session show the same numbers. Model work runs in the thread pool; the engine's
lock serialises it with the batcher's runs. Reference sets (the built-in UD EWT sample, or the
``--store`` given at start) and masked-LM heads are built once per model, on first use.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool
from starlette.staticfiles import StaticFiles

from ..errors import LayerwiseError, OptionError
from ._errors import mapped_route_class
from ._explorer_media import MediaRequest, media_view
from ._explorer_views import VIEWS, TextRequest, View
from ._responses import ApiError, json_response
from ._schemas import error_responses

EXPLORE_ERRORS = (401, 404, 413, 422, 429, 500, 503)

if TYPE_CHECKING:
    from .._encoder import Encoder
    from .._results import LayerStack
    from .._settings.serve import ServeSettings
    from ..explore import CausalLMHead, MaskedLMHead, ReferenceSet
    from ._batcher import Batcher

STATIC = Path(str(resources.files("layerwise.explore").joinpath("static")))
# The page runs only its own script and talks only to this server: an injected tag or handler
# would not run even if escaping failed somewhere (the page itself never parses user text as HTML).
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


class Explorer:
    """What the explorer's routes serve (``app.state.explorer``): the served models, the batcher's
    ``run`` and ``pick``, the text bound; per model its reference set and language-model head,
    built once on first use."""

    def __init__(
        self,
        *,
        models: dict,
        pick: Callable[[str | None], Any],
        run: Callable[..., Any],
        batcher: Batcher,
        max_tokens: int,
        settings: ServeSettings,
        store: str | os.PathLike | None = None,
        store_model: str | None = None,
    ) -> None:
        self.models, self.pick, self.run, self.batcher, self.max_tokens = (
            models,
            pick,
            run,
            batcher,
            max_tokens,
        )
        self.store, self.store_model, self.settings = store, store_model, settings
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

    async def stack_of(self, served: Any, body: TextRequest) -> LayerStack:
        """Every hidden state of the request's text (windows past the model's length), through the
        batcher; a text over ``max_tokens`` is a 413 naming the limit."""
        raw = _text_inputs(body)
        results, _, _ = await self.run(
            served, raw, None, bytes_per_value=0, window=True, max_tokens=self.max_tokens
        )
        return results[0]

    def bounded(self, encoder: Encoder, body: TextRequest):
        """Admission for the side work on ``body``'s text (see the module docstring)."""
        return self.batcher.side_work(_check_size(encoder, body, self.max_tokens))


def add_explorer(
    app: FastAPI,
    *,
    models: dict,
    pick: Callable[[str | None], Any],
    run: Callable[..., Any],
    batcher: Batcher,
    max_tokens: int,
    settings: ServeSettings,
    store: str | os.PathLike | None = None,
) -> None:
    """Mount the page and its endpoints on ``app`` (see the module docstring). ``store`` must be a
    token-level store written by one of the served models (checked here, before serving)."""
    store_model = _store_model(store, {served.name for served in models.values()}) if store else None
    app.state.explorer = Explorer(
        models=models,
        pick=pick,
        run=run,
        batcher=batcher,
        max_tokens=max_tokens,
        settings=settings,
        store=store,
        store_model=store_model,
    )
    app.include_router(router)
    app.mount("/explore", StaticFiles(directory=STATIC), name="explore-static")


def _explorer(request: Request) -> Explorer:
    return request.app.state.explorer


Served = Annotated[Explorer, Depends(_explorer)]
router = APIRouter(route_class=mapped_route_class())  # errors through the service's one mapping


@router.get("/", include_in_schema=False)
async def page():
    return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": CSP})


@router.get(
    "/v1/explore/info",
    summary="Explorer: served models, what each view can show",
    response_model=dict[str, Any],
    responses=error_responses(401, 404, 422, 500),
)
async def info(explorer: Served):
    from .._analysis.plot import PROJECTIONS

    entries = []
    for name, served in explorer.models.items():
        if name != served.name:
            continue  # aliases
        enc = served.encoder
        if enc.modality != "text":  # the media view (/v1/explore/media) shows it
            entries.append(_media_entry(name, enc))
            continue
        head = await run_in_threadpool(explorer.head, name, enc)
        entries.append(
            {
                "id": name,
                "modality": "text",
                "n_hidden_states": enc.n_hidden_states,
                "n_heads": int(getattr(enc.models.config, "num_attention_heads", 0) or 0),  # 0: none (Mamba)
                "hidden_size": enc.hidden_size,
                "max_length": enc.max_length,
                "lens": head is not None,
                "mask_token": enc.tokenizer.mask_token,
                "decoder": enc.is_decoder,  # its lens reads the next token, no [MASK] needed
                "final_norm": enc.final_norm if enc.models.takes_final_norm else None,  # the views' states
                "reference": "store" if explorer.store_model == enc.name else "sample",
            }
        )
    return {"models": entries, "projections": [p for p in PROJECTIONS if _installed(p)]}


@router.get(
    "/v1/explore/similarity",
    summary="Explorer: linear CKA between layers over the reference set",
    response_model=dict[str, Any],
    responses=error_responses(401, 404, 422, 500),
)
async def similarity(explorer: Served, model: str | None = None):
    served = explorer.pick(model)
    _text_only(served)

    def work():
        reference = explorer.reference(served.name, served.encoder)
        return {
            "model": served.name,
            "reference": reference.name,
            "layers": list(reference.layers),
            "cka": np.round(reference.similarity, 6).tolist(),
        }

    return json_response(await run_in_threadpool(work))


def _route(view: View) -> Callable:
    """The endpoint of ``view``: the request's model picked, its stack fetched when the view needs it,
    the work in the thread pool (errors: the service's one mapping)."""

    async def endpoint(explorer: Explorer, body: Any):
        served = explorer.pick(body.model)
        _text_only(served)
        stack = await explorer.stack_of(served, body) if view.with_stack else None
        return json_response(await run_in_threadpool(view.work, explorer, served, body, stack))

    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
    endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # what FastAPI reads
        [
            inspect.Parameter("explorer", keyword, annotation=Served),
            inspect.Parameter("body", keyword, annotation=view.request),
        ]
    )
    endpoint.__name__ = view.name
    return endpoint


@router.post(
    "/v1/explore/media",
    summary="Explorer: an image's patches or a clip's frames, statistics per layer",
    response_model=dict[str, Any],
    responses=error_responses(*EXPLORE_ERRORS),
)
async def media(explorer: Served, body: MediaRequest):
    served = explorer.pick(body.model)
    return json_response(await run_in_threadpool(media_view, explorer, served, body))


for _view in VIEWS:
    router.add_api_route(
        f"/v1/explore/{_view.name}",
        _route(_view),
        methods=["POST"],
        summary=_view.summary,
        response_model=dict[str, Any],
        responses=error_responses(*EXPLORE_ERRORS),
    )


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


def _text_only(served: Any) -> None:
    """The text views refuse an image or a speech model, naming the view that shows it."""
    modality = served.encoder.modality
    if modality != "text":
        raise ApiError(
            422,
            f"model {served.name!r} reads {'images' if modality == 'image' else 'sound'}: the text views do "
            "not apply; POST /v1/explore/media shows its units layer by layer",
            param="model",
        )


def _media_entry(name: str, enc: Any) -> dict:
    return {
        "id": name,
        "modality": enc.modality,
        "n_hidden_states": enc.n_hidden_states,
        "n_heads": int(getattr(enc.config, "num_attention_heads", 0) or 0),
        "hidden_size": enc.hidden_size,
        "max_length": enc.max_length,
        "lens": False,
        "mask_token": None,
        "decoder": False,
        "final_norm": None,
        "reference": None,
    }


def _installed(projection: str) -> bool:
    import importlib.util

    module = {"pca": "sklearn", "tsne": "sklearn", "umap": "umap"}[projection]
    return importlib.util.find_spec(module) is not None


def _text_inputs(body: TextRequest):
    """The request's text (and pair) as inputs; a text that cannot be one is a 422 on ``text``."""
    from .._inputs.raw import normalize_inputs

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
