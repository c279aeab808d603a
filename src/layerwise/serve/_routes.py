"""The service's routes on an APIRouter: module-level functions with the served state
(:class:`service.Service`) as a dependency. create_app (app.py) includes them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from .._features.plan import OutputPlan
from ._errors import mapped_route_class
from ._responses import json_response, layer_item
from ._schemas import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    HealthResponse,
    LayersRequest,
    LayersResponse,
    ModelsResponse,
    error_responses,
)
from ._service import Service, _off_loop, _raw

NPZ = "application/x-npz"
POST_ERRORS = (401, 404, 413, 422, 429, 500, 503)
NPZ_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {NPZ: {"schema": {"type": "string", "format": "binary"}}},
          "description": "JSON, or with Accept: application/x-npz the .npz file"},
}  # fmt: skip
LAYERS_RESPONSES: dict[int | str, dict[str, Any]] = {**error_responses(*POST_ERRORS), **NPZ_RESPONSE}


def _service(request: Request) -> Service:
    return request.app.state.service


Served = Annotated[Service, Depends(_service)]
router = APIRouter(route_class=mapped_route_class())  # every route's errors through the one mapping


# Served by FastEmbeddings (fast_path.py) before FastAPI sees it; the route documents the endpoint
# in /docs and answers the same way where the app is mounted under a prefix.
@router.post("/v1/embeddings", summary="OpenAI-compatible embeddings: one vector per input",
             response_model=EmbeddingsResponse, responses=error_responses(*POST_ERRORS))  # fmt: skip
async def embeddings(body: EmbeddingsRequest, service: Served):
    return json_response(await service.answer_embeddings(body))


@router.post("/v1/layers", summary="Tokens, offsets, word ids and vectors of the requested layers",
             response_model=LayersResponse, responses=LAYERS_RESPONSES)  # fmt: skip
async def layers_endpoint(body: LayersRequest, request: Request, service: Served):
    served = service.pick(body.model)
    raw = _raw(texts=body.texts, text_pairs=body.text_pairs, pairs=body.pairs, words=body.words)
    plan = served.encoder.settle(
        OutputPlan.parse(
            layers=body.layers, pool=body.pool, fuse=body.fuse, special_tokens=body.special_tokens,
            dtype=body.dtype, normalize=body.normalize, final_norm=body.final_norm,
            long_texts=service.settings.long_texts,
            stride=service.settings.stride if service.settings.long_texts == "window" else None,
        )
    )  # fmt: skip
    as_npz = NPZ in request.headers.get("accept", "")
    per_value = (2 if plan.dtype == "float16" else 4) * (1 if as_npz else 4 / 3)  # base64 in JSON
    results, n_tokens, _ = await service.run(served, raw, plan, bytes_per_value=per_value)
    n_hidden = served.encoder.n_hidden_states
    meta = {
        "model": served.name,
        **plan.meta(n_hidden),
        "max_length": served.encoder.max_length,
        "model_dtype": served.encoder.model_dtype,
    }
    if as_npz:
        from .._files.writers import npz_bytes

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


@router.get("/v1/models", summary="The models this server serves", response_model=ModelsResponse,
            responses=error_responses(401, 500))  # fmt: skip
async def list_models(service: Served):
    data = [
        {
            "id": name,
            "object": "model",
            "created": service.started_at,
            "owned_by": "layerwise",
            "n_hidden_states": enc.n_hidden_states,
            "hidden_size": enc.hidden_size,
            "max_length": enc.max_length,
        }
        for name, enc in service.encoders.items()
    ]
    return {"object": "list", "data": data}


@router.get("/health", summary="Liveness: the worker runs and the models are loaded",
            response_model=HealthResponse, responses={503: {"model": HealthResponse}})  # fmt: skip
async def health(service: Served):
    jobs, tokens = service.batcher.queued
    alive = service.batcher.alive
    body = {
        "status": "ok" if alive else "stopped",
        "models": list(service.encoders),
        "queue": {"requests": jobs, "tokens": tokens},
    }
    return JSONResponse(body, status_code=200 if alive else 503)


@router.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse,
            responses=error_responses(401, 500))  # fmt: skip
async def prometheus(service: Served):
    content, media_type = service.metrics.exposition()
    return Response(content, media_type=media_type)
