"""The service's routes on an APIRouter: module-level functions with the served state
(:class:`service.Service`) as a dependency. create_app (_app.py) includes them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from ._errors import mapped_route_class
from ._responses import NPZ, json_response
from ._schemas import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    HealthResponse,
    LayersRequest,
    LayersResponse,
    ModelsResponse,
    error_responses,
)
from ._service import Service

POST_ERRORS = (401, 404, 413, 422, 429, 500, 503)
NPZ_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {NPZ: {"schema": {"type": "string", "format": "binary"}}},
        "description": "JSON, or with Accept: application/x-npz the .npz file",
    },
}
LAYERS_RESPONSES: dict[int | str, dict[str, Any]] = {**error_responses(*POST_ERRORS), **NPZ_RESPONSE}


def _service(request: Request) -> Service:
    return request.app.state.service


Served = Annotated[Service, Depends(_service)]
router = APIRouter(route_class=mapped_route_class())  # every route's errors through the one mapping


# Served by FastEmbeddings (fast_path.py) before FastAPI sees it; the route documents the endpoint
# in /docs and answers the same way where the app is mounted under a prefix.
@router.post(
    "/v1/embeddings",
    summary="OpenAI-compatible embeddings: one vector per input",
    response_model=EmbeddingsResponse,
    responses=error_responses(*POST_ERRORS),
)
async def embeddings(body: EmbeddingsRequest, service: Served):
    return json_response(await service.answer_embeddings(body))


@router.post(
    "/v1/layers",
    summary="Tokens, offsets, word ids and vectors of the requested layers",
    response_model=LayersResponse,
    responses=LAYERS_RESPONSES,
)
async def layers_endpoint(body: LayersRequest, request: Request, service: Served):
    return await service.answer_layers(body, as_npz=NPZ in request.headers.get("accept", ""))


@router.get(
    "/v1/models",
    summary="The models this server serves",
    response_model=ModelsResponse,
    responses=error_responses(401, 500),
)
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
            "modality": enc.modality,
        }
        for name, enc in service.encoders.items()
    ]
    return {"object": "list", "data": data}


@router.get(
    "/health",
    summary="Liveness: the worker runs and the models are loaded",
    response_model=HealthResponse,
    responses={503: {"model": HealthResponse}},
)
async def health(service: Served):
    jobs, tokens = service.batcher.queued
    alive = service.batcher.alive
    body = {
        "status": "ok" if alive else "stopped",
        "models": list(service.encoders),
        "queue": {"requests": jobs, "tokens": tokens},
    }
    return JSONResponse(body, status_code=200 if alive else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=PlainTextResponse,
    responses=error_responses(401, 500),
)
async def prometheus(service: Served):
    content, media_type = service.metrics.exposition()
    return Response(content, media_type=media_type)
