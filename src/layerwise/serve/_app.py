"""The FastAPI application: OpenAI-compatible embeddings, per-layer vectors, health, models, metrics.

Every request is: validate (422) -> tokenise and check its size (413) -> queue (429) -> one shared
model run, where the request's OutputPlan is applied to its rows (_batcher.py) -> encode the
response. Only the models given to :func:`create_app` are served; a request names one of them and
nothing else: it cannot load a model, read a path or write a file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .._settings.serve import ServeSettings
from .._version import __version__
from ..errors import OptionError
from ._batcher import Batcher
from ._docs_pages import add_docs_pages
from ._errors import error_response, mapped_route_class
from ._fast_path import FastEmbeddings, ServedApp
from ._limits import LimitBody, RequireKey
from ._metrics import Metrics, ObserveRequests
from ._routes import router
from ._served_schema import describe_served
from ._service import Service

if TYPE_CHECKING:
    from .._encoder import Encoder

logger = logging.getLogger("layerwise")
# the server answers requests as they come; a streamed model reads all its weights for every block
NOT_INTERACTIVE = (
    "{} is streamed (streaming=True, --streaming): every block of texts reads all of its weights, so each "
    "request would wait for the whole model to be read, and a server cannot answer interactively that "
    "way. Serve a model that fits in memory; streaming is for corpus work (extract, cache, layers, probe)"
)


def _check_servable(encoders: Mapping[str, Encoder]) -> None:
    """Refuse, by name, models the service cannot answer for: none, a streamed one (each request
    would read its weights)."""
    if not encoders:
        raise OptionError("create_app needs at least one model")
    streamed = [name for name, enc in encoders.items() if getattr(enc, "streamed", False)]
    if streamed:
        raise OptionError(NOT_INTERACTIVE.format(", ".join(map(repr, streamed))))


def create_app(
    encoders: Mapping[str, Encoder],
    settings: ServeSettings | None = None,
    *,
    explorer: bool = True,
    reference_store: str | os.PathLike | None = None,
):
    """The ASGI app serving ``encoders`` (name -> Encoder, each loaded once, before this call).
    ``explorer``: serve the layer explorer page at ``/`` (its neighbours, projections and CKA use
    ``reference_store``, a token-level store of one of the models, else the built-in sample)."""
    _check_servable(encoders)
    settings = settings or ServeSettings()
    metrics = Metrics()
    batcher = Batcher(
        encoders,
        max_batch_tokens=settings.max_batch_tokens,
        max_wait=settings.max_wait_ms / 1000,
        max_queue_tokens=settings.max_queue_tokens,
        max_queue_bytes=settings.max_queue_bytes,
        runner=_runner(encoders, settings),
        metrics=metrics,
    )
    service = Service(encoders, settings, batcher, metrics)

    @asynccontextmanager
    async def lifespan(app):
        await run_in_threadpool(batcher.start)  # the model process, if any, has loaded its models
        yield
        await run_in_threadpool(batcher.close)  # finish what is queued (SIGTERM drains)

    app = ServedApp(
        title="layerwise",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,  # served from this machine's files (docs_pages.py), not FastAPI's CDN pages
        redoc_url=None,
        description="Every layer of text encoders, decoder LMs, image and speech models over HTTP. "
        "OpenAI-compatible /v1/embeddings (text); /v1/layers for tokens, words, patches, frames and "
        "sentences at any layer.",
    )
    describe_served(app, encoders)
    app.state.batcher, app.state.metrics, app.state.settings = batcher, metrics, settings
    app.state.service = service
    app.router.route_class = mapped_route_class()  # every route's errors through the one mapping
    add_docs_pages(app)
    app.include_router(router)

    # errors raised outside a route (no such route, a method it lacks): the same mapping
    app.add_exception_handler(StarletteHTTPException, lambda request, exc: error_response(exc))
    app.add_exception_handler(RequestValidationError, lambda request, exc: error_response(exc))

    if explorer:
        from ._explorer import add_explorer

        add_explorer(
            app,
            models=service.models,
            pick=service.pick,
            run=service.run,
            batcher=batcher,
            max_tokens=settings.max_explore_tokens,
            settings=settings,
            store=reference_store,
        )
    app.add_middleware(LimitBody, max_bytes=settings.max_body_bytes)
    # the key is checked before a body is read or validated: a stranger learns nothing of the schema
    app.add_middleware(RequireKey, api_key=settings.api_key)
    app.add_middleware(ObserveRequests, metrics=metrics)  # outside LimitBody: counts the 413s too
    # POST /v1/embeddings never enters FastAPI nor the layers above (its own limits and metrics)
    app.fast_embeddings = FastEmbeddings(
        answer=service.answer_embeddings,
        api_key=settings.api_key,
        metrics=metrics,
        max_bytes=settings.max_body_bytes,
    )
    return app


# ---------------------------------------------------------------------------------------------- helpers
def _runner(encoders: Mapping[str, Encoder], settings: ServeSettings):
    """The batcher's runner of the text models (an image or a speech model runs in this process,
    one request at a time: _media.py)."""
    from ._runners import LocalRunner

    encoders = {name: enc for name, enc in encoders.items() if enc.modality == "text"}
    if settings.model_process and encoders:
        from ._model_process import ProcessRunner

        return ProcessRunner(encoders, settings.concurrent_forwards)
    return LocalRunner(encoders, settings.concurrent_forwards or 1)
