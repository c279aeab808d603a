"""The FastAPI application: OpenAI-compatible embeddings, per-layer vectors, health, models, metrics.

Every request is: validate (422) -> tokenise and check its size (413) -> queue (429) -> one shared
model run, where the request's OutputPlan is applied to its rows (batcher.py) -> encode the
response. Only the models given to :func:`create_app` are served; a request names one of them and
nothing else: it cannot load a model, read a path or write a file.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import time
from collections.abc import Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import OptionError
from ..features.plan import OutputPlan, levelled_pool
from ..features.pool import SENTENCE_POOLS
from .admission import check_response_size, result_values, tokenise
from .batcher import Batcher, Finish, Job
from .docs_pages import add_docs_pages
from .errors import error_response, mapped_route_class
from .fast_path import FastEmbeddings, ServedApp
from .limits import LimitBody, RequireKey, ServeSettings
from .metrics import Metrics, ObserveRequests
from .responses import ApiError, json_response, layer_item
from .schemas import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    HealthResponse,
    LayersRequest,
    LayersResponse,
    ModelsResponse,
    error_responses,
)
from .served_schema import describe_served, model_ids

if TYPE_CHECKING:
    from ..encoder import Encoder
    from ..inputs.encoding import RawInputs

logger = logging.getLogger("layerwise")
NPZ = "application/x-npz"
POST_ERRORS = (401, 404, 413, 422, 429, 500, 503)
NPZ_RESPONSE = {200: {"content": {NPZ: {"schema": {"type": "string", "format": "binary"}}},
                      "description": "JSON, or with Accept: application/x-npz the .npz file"}}  # fmt: skip


@dataclass
class Served:
    name: str
    encoder: Encoder


def served_names(encoders: Mapping[str, Encoder]) -> dict[str, Served]:
    """Model ids a request may name (served_schema.model_ids: full names and unique short ones)."""
    served = {name: Served(name, enc) for name, enc in encoders.items()}
    return {alias: served[name] for alias, name in model_ids(list(encoders)).items()}


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
    if not encoders:
        raise OptionError("create_app needs at least one model")
    settings = settings or ServeSettings()
    models = served_names(encoders)
    default_model = next(iter(encoders))
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
    started_at = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        await run_in_threadpool(batcher.start)  # the model process, if any, has loaded its models
        yield
        await run_in_threadpool(batcher.close)  # finish what is queued (SIGTERM drains)

    app = ServedApp(
        title="layerwise",
        version=_version(),
        lifespan=lifespan,
        docs_url=None,  # served from this machine's files (docs_pages.py), not FastAPI's CDN pages
        redoc_url=None,
        description="Every layer of BERT-family encoders and decoder LMs over HTTP. OpenAI-compatible "
        "/v1/embeddings; /v1/layers for tokens, words and sentences at any layer.",
    )
    describe_served(app, encoders)
    app.state.batcher, app.state.metrics, app.state.settings = batcher, metrics, settings
    app.router.route_class = mapped_route_class()  # every route's errors through the one mapping
    add_docs_pages(app)

    # errors raised outside a route (no such route, a method it lacks): the same mapping
    app.add_exception_handler(StarletteHTTPException, lambda request, exc: error_response(exc))
    app.add_exception_handler(RequestValidationError, lambda request, exc: error_response(exc))

    def pick(model: str | None) -> Served:
        if model is None:
            return models[default_model]
        if model not in models:
            raise ApiError(
                404,
                f"model {model!r} is not served here; served: {', '.join(sorted(models))}",
                param="model",
                code="model_not_found",
            )
        return models[model]

    async def run(
        served: Served,
        raw: RawInputs,
        plan: OutputPlan | None,
        *,
        bytes_per_value: float = 4.0,
        window: bool | None = None,
        max_tokens: int | None = None,
    ) -> tuple[list, int, list[bool]]:
        """Queue the inputs, wait for their results (the plan applied; None: every hidden state as a
        LayerStack): (results, tokens, truncated). ``bytes_per_value``: what one value of a result
        costs in the response, for its size bound; ``window``: long inputs in windows (default: the
        server's --long-texts); ``max_tokens``: the request's token limit (default: the server's)."""
        enc = served.encoder
        n_hidden = enc.n_hidden_states
        plan = enc.settle(plan) if plan is not None else None  # its final norm: the request's or ours
        final_norm: Any = plan.final_norm if plan is not None and enc.is_decoder else enc.final_norm
        layers = plan.hidden_states(n_hidden) if plan is not None else tuple(range(n_hidden))
        if not len(raw):
            raise ApiError(422, f"{raw.field} is an empty list; send at least one input", param=raw.field)
        # what the forward does is what the plan (recorded in the response) says: its long texts, stride
        if plan is not None:
            window, stride = plan.long_texts == "window", plan.stride
        else:  # every hidden state as a LayerStack (the explorer): windows when asked, else the server's
            window = settings.long_texts == "window" if window is None else window
            stride = settings.stride
        limit = (
            (max_tokens, "--max-explore-tokens")
            if max_tokens
            else (settings.max_request_tokens, "--max-request-tokens")
        )
        encoded = await _off_loop(_size(raw), tokenise, enc, raw, settings, len(layers), window, limit)
        values = result_values(plan, encoded, enc.hidden_size, n_hidden)
        check_response_size(int(values * bytes_per_value), settings.max_response_bytes)
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def done(results, error) -> None:
            loop.call_soon_threadsafe(_settle, future, results, error)

        finish = Finish(layers, plan, n_hidden)
        job = Job(served.name, encoded, finish, done, stride=stride if window else None,
                  final_norm=final_norm, n_bytes=int(values * 4))  # fmt: skip
        batcher.submit(job)  # a full queue: QueueFullError, 429 (serve/errors.py maps every error)
        results = await future  # this request's own failure in the run (the batcher re-ran it apart)
        return [results[i] for i in range(len(encoded))], job.n_tokens, [item.truncated for item in encoded]

    async def answer_embeddings(body: EmbeddingsRequest) -> dict:
        """The response body of ``POST /v1/embeddings`` (an ApiError for a refused request): the
        route below and the fast path in front of FastAPI (fast_path.py) both answer with it."""
        served = pick(body.model)
        texts = [body.input] if isinstance(body.input, str) else body.input
        if not texts:
            raise ApiError(422, "input is an empty list; send at least one text", param="input")
        plan = _embeddings_plan(served.encoder, body, settings)
        width = plan.row_shape(served.encoder.hidden_size, served.encoder.n_hidden_states)
        if len(width) == 2 and width[0] != 1:
            raise ApiError(
                422,
                f"layers={body.layers!r} gives {width[0]} vectors per input and /v1/embeddings "
                "returns one: add fuse (e.g. concat_last4, mean_all), or use /v1/layers",
                param="layers",
            )
        if body.dimensions is not None and body.dimensions != width[-1]:
            raise ApiError(
                422,
                f"dimensions={body.dimensions} is not supported: these vectors have "
                f"{width[-1]} dimensions and layerwise does not cut or project them; leave "
                "dimensions out",
                param="dimensions",
            )
        per_value = 20.0 if body.encoding_format == "float" else 4 * 4 / 3  # a float as JSON text; base64
        results, n_tokens, truncated = await run(served, _raw(texts=texts), plan, bytes_per_value=per_value)
        data = []
        for i, result in enumerate(results):
            vector = result.vector.reshape(-1).astype(np.float32)
            value: Any = (
                vector.tolist()
                if body.encoding_format == "float"
                else base64.b64encode(vector.astype("<f4").tobytes()).decode()
            )
            data.append({"object": "embedding", "index": i, "embedding": value, "truncated": truncated[i]})
        return {
            "object": "list",
            "data": data,
            "model": served.name,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }

    # Served by FastEmbeddings (below) before FastAPI sees it; the route documents the endpoint
    # in /docs and answers the same way where the app is mounted under a prefix.
    @app.post("/v1/embeddings", summary="OpenAI-compatible embeddings: one vector per input",
              response_model=EmbeddingsResponse, responses=error_responses(*POST_ERRORS))  # fmt: skip
    async def embeddings(body: EmbeddingsRequest):
        return json_response(await answer_embeddings(body))

    layers_responses = {**error_responses(*POST_ERRORS), **NPZ_RESPONSE}

    @app.post("/v1/layers", summary="Tokens, offsets, word ids and vectors of the requested layers",
              response_model=LayersResponse, responses=layers_responses)  # fmt: skip
    async def layers_endpoint(body: LayersRequest, request: Request):
        served = pick(body.model)
        raw = _raw(texts=body.texts, text_pairs=body.text_pairs, pairs=body.pairs, words=body.words)
        plan = served.encoder.settle(
            OutputPlan.parse(
                layers=body.layers, pool=body.pool, fuse=body.fuse, special_tokens=body.special_tokens,
                dtype=body.dtype, normalize=body.normalize, final_norm=body.final_norm,
                long_texts=settings.long_texts,
                stride=settings.stride if settings.long_texts == "window" else None,
            )
        )  # fmt: skip
        as_npz = NPZ in request.headers.get("accept", "")
        per_value = (2 if plan.dtype == "float16" else 4) * (1 if as_npz else 4 / 3)  # base64 in JSON
        results, n_tokens, _ = await run(served, raw, plan, bytes_per_value=per_value)
        n_hidden = served.encoder.n_hidden_states
        meta = {
            "model": served.name,
            **plan.meta(n_hidden),
            "max_length": served.encoder.max_length,
            "model_dtype": served.encoder.model_dtype,
        }
        if as_npz:
            from ..files.writers import npz_bytes

            content = await run_in_threadpool(
                npz_bytes,
                enumerate(results),
                texts=raw.texts,
                text_pairs=raw.text_pairs,
                meta=meta,
                dtype=plan.dtype,
            )
            return Response(content, media_type=NPZ)
        work = n_tokens * len(meta["layers"])
        items = await _off_loop(work, lambda: [layer_item(i, r, plan.dtype) for i, r in enumerate(results)])
        response_body = {
            "object": "layers",
            **meta,
            "results": items,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }
        return await _off_loop(work, json_response, response_body)

    @app.get("/v1/models", summary="The models this server serves", response_model=ModelsResponse,
             responses=error_responses(401, 500))  # fmt: skip
    async def list_models():
        data = [
            {
                "id": name,
                "object": "model",
                "created": started_at,
                "owned_by": "layerwise",
                "n_hidden_states": enc.n_hidden_states,
                "hidden_size": enc.hidden_size,
                "max_length": enc.max_length,
            }
            for name, enc in encoders.items()
        ]
        return {"object": "list", "data": data}

    @app.get("/health", summary="Liveness: the worker runs and the models are loaded",
             response_model=HealthResponse, responses={503: {"model": HealthResponse}})  # fmt: skip
    async def health():
        jobs, tokens = batcher.queued
        alive = batcher.alive
        body = {
            "status": "ok" if alive else "stopped",
            "models": list(encoders),
            "queue": {"requests": jobs, "tokens": tokens},
        }
        return JSONResponse(body, status_code=200 if alive else 503)

    @app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse,
             responses=error_responses(401, 500))  # fmt: skip
    async def prometheus():
        content, media_type = metrics.exposition()
        return Response(content, media_type=media_type)

    if explorer:
        from .explorer import add_explorer

        add_explorer(app, models=models, pick=pick, run=run, batcher=batcher,
                     max_tokens=settings.max_explore_tokens, store=reference_store)  # fmt: skip
    app.add_middleware(LimitBody, max_bytes=settings.max_body_bytes)
    # the key is checked before a body is read or validated: a stranger learns nothing of the schema
    app.add_middleware(RequireKey, api_key=settings.api_key)
    app.add_middleware(ObserveRequests, metrics=metrics)  # outside LimitBody: counts the 413s too
    # POST /v1/embeddings never enters FastAPI nor the layers above (its own limits and metrics)
    app.fast_embeddings = FastEmbeddings(
        answer=answer_embeddings, api_key=settings.api_key, metrics=metrics, max_bytes=settings.max_body_bytes
    )
    return app


# ---------------------------------------------------------------------------------------------- helpers
def _runner(encoders: Mapping[str, Encoder], settings: ServeSettings):
    from .runners import LocalRunner

    if settings.model_process:
        from .model_process import ProcessRunner

        return ProcessRunner(encoders, settings.streams)
    return LocalRunner(encoders, settings.streams or 1)


def _version() -> str:
    from .. import __version__

    return __version__


# Work below this size runs on the event loop: a hop to the thread pool costs more than it, and
# every extra thread contending for the GIL slows the model thread (each torch op gives the GIL up
# and must win it back).
_INLINE_WORK = 20_000


def _size(raw: RawInputs) -> int:
    return sum(len(t) for t in raw.texts) + sum(len(t) for t in raw.text_pairs or ())


async def _off_loop(work: int, function, *args):
    """``function(*args)`` inline when ``work`` is small, else in the thread pool."""
    if work <= _INLINE_WORK:
        return function(*args)
    return await run_in_threadpool(function, *args)


def _settle(future, results, error) -> None:
    if future.done():  # the client went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(results)


def _raw(**inputs) -> RawInputs:
    from ..inputs.encoding import normalize_inputs

    return normalize_inputs(**inputs)  # an InputError is a 422 naming the field (serve/errors.py)


def _embeddings_plan(encoder: Encoder, body: EmbeddingsRequest, settings: ServeSettings) -> OutputPlan:
    """Defaults follow the model's sentence-transformers convention (Encoder.encode): last layer,
    its pooling, its normalisation; every field the request sets overrides them."""
    from ..model.source import sentence_convention

    st = encoder.sentence_transformers
    pool = body.pool
    if pool is None:  # the model's own pooling; one layerwise does not implement is an error
        try:
            pool = f"sentence:{sentence_convention(st)[0]}"
        except OptionError as exc:
            raise ApiError(422, f"{exc}: pass pool (e.g. sentence:mean)", param="pool") from None
    normalize = body.normalize if body.normalize is not None else bool(st and st.normalize)
    if not levelled_pool(pool).startswith("sentence:"):  # "mean" as Encoder.embed takes it is one
        raise ApiError(
            422,
            f"pool={pool!r}: /v1/embeddings returns one vector per input; use "
            f"{', '.join(f'sentence:{mode}' for mode in SENTENCE_POOLS)} (or the bare mode), "
            "or /v1/layers for token and word vectors",
            param="pool",
        )
    layers = body.layers if body.layers is not None or body.fuse is not None else -1
    return encoder.settle(
        OutputPlan.parse(
            layers=layers, pool=pool, fuse=body.fuse, special_tokens=body.special_tokens, normalize=normalize,
            final_norm=body.final_norm, long_texts=settings.long_texts,
            stride=settings.stride if settings.long_texts == "window" else None,
        )
    )  # fmt: skip
