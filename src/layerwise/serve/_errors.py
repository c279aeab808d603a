"""The service's one error mapping: whatever a request raises becomes one OpenAI-shaped answer.

Every endpoint, the fast ``POST /v1/embeddings`` path and the FastAPI routes alike, answers an
exception through :func:`error_response`, so the same bad value gets the same status, ``type``,
``param`` and ``code`` everywhere:

    ApiError                         its own status (the service's explicit refusals)
    QueueFullError                   429 + Retry-After
    ModelProcessError                503
    InputTooLargeError               413
    LayerSpecError                   422, param "layers"
    InputError, OptionError, other   422, param: the field the message names
      LayerwiseError
    NonFiniteError                   500, code "nonfinite_output" (the model produced NaN/inf)
    pydantic / FastAPI validation    422 naming the field and what it takes
    a body FastAPI cannot parse      422, code "invalid_json"
    Starlette's HTTP errors          their status (404 no such route, 405 method)
    anything else                    500, code "internal_error", with a request id that is also in
                                     the log line (and the X-Request-Id header)
"""

from __future__ import annotations

import logging
import uuid

from ..errors import InputTooLargeError, LayerSpecError, LayerwiseError, NonFiniteError
from ._jobs import QueueFullError
from ._responses import ApiError, validation_error

logger = logging.getLogger("layerwise")

# Fields a message can name at its start (InputError and OptionError messages say which value was bad).
_FIELDS = (
    "texts",
    "text_pairs",
    "pairs",
    "words",
    "input",
    "layers",
    "pool",
    "fuse",
    "special_tokens",
    "normalize",
    "dtype",
    "final_norm",
    "model",
)


def param_of(message: str) -> str | None:
    """The request field a layerwise error message is about, when it names one early on."""
    for name in _FIELDS:
        if message.startswith(name) or f" {name}" in message[:40]:
            return name
    return None


def api_error(exc: BaseException) -> ApiError:
    """The answer to ``exc`` (see the module docstring)."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError
    from starlette.exceptions import HTTPException

    from ._model_process import ModelProcessError

    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, QueueFullError):
        return ApiError(429, str(exc), code="queue_full", headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, ModelProcessError):
        return ApiError(503, str(exc), code="model_unavailable")
    if isinstance(exc, InputTooLargeError):
        return ApiError(413, str(exc), code="input_too_large")
    if isinstance(exc, LayerSpecError):
        return ApiError(422, str(exc), param="layers")
    if isinstance(exc, NonFiniteError):
        return ApiError(500, str(exc), code="nonfinite_output")
    if isinstance(exc, LayerwiseError):
        return ApiError(422, str(exc), param=param_of(str(exc)))
    if isinstance(exc, RequestValidationError):
        return validation_error(list(exc.errors()))
    if isinstance(exc, ValidationError):
        return validation_error([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()])
    if isinstance(exc, HTTPException):
        if exc.status_code == 400:  # FastAPI: "There was an error parsing the body" (e.g. too deep)
            message = "the body could not be read as JSON (malformed, or nested too deeply)"
            return ApiError(422, message, code="invalid_json")
        return ApiError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {}))
    request_id = uuid.uuid4().hex[:16]
    logger.error("request %s failed: %s: %s", request_id, type(exc).__name__, exc, exc_info=exc)
    return ApiError(
        500,
        f"the server failed on this request ({type(exc).__name__}); it is logged as request {request_id}",
        code="internal_error",
        headers={"X-Request-Id": request_id},
    )


def error_response(exc: BaseException):
    """``exc`` answered as a JSON response (see :func:`api_error`)."""
    from fastapi.responses import JSONResponse

    error = api_error(exc)
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def mapped_route_class():
    """FastAPI's route class with every exception its handler raises (validation included) answered
    by :func:`error_response`: no route maps an error on its own, none answers a bare 500."""
    from fastapi.routing import APIRoute

    class MappedRoute(APIRoute):
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def mapped(request):
                try:
                    return await handler(request)
                except Exception as exc:
                    return error_response(exc)

            return mapped

    return MappedRoute
