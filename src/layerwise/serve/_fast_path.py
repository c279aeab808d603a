"""``POST /v1/embeddings`` answered in one ASGI step, without FastAPI's request machinery.

Why: it is the endpoint applications call hundreds of times a second, one short text each, and the
HTTP process shares the machine's cores with the model. Through FastAPI a request cost the event
loop about 0.6 ms of CPU (32 clients, 2 cores): routing, dependency solving, the request and
response objects, content-type parsing with the ``email`` package, and a chain of six middleware
layers, each wrapping ``send`` and ``receive``. :class:`ServedApp` (the app ``create_app`` returns)
hands the request to :class:`FastEmbeddings` before any of them, which does what a request needs, no
more: the API key, the body limit, pydantic's JSON validation of the same
:class:`EmbeddingsRequest`, the same handler as the FastAPI route (``answer``), the same error
bodies, and the same metrics. Every other path and method goes on to FastAPI, which still documents
the endpoint (``/docs``, ``/openapi.json``). The tests of the endpoint run through this path.
(It was the outermost of the app's middleware before: still inside FastAPI's own telemetry check and
Starlette's error middleware, 6 us more per request: 22 against 16 us of CPU for the ASGI layers and
a stub handler, an ad-hoc timing.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from ._errors import api_error
from ._limits import body_too_large, key_error, key_matches
from ._responses import ApiError, json_bytes
from ._schemas import EmbeddingsRequest

if TYPE_CHECKING:
    from ._metrics import Metrics

logger = logging.getLogger("layerwise")
PATH = "/v1/embeddings"
NOT_JSON = "the body must be a JSON object; send Content-Type: application/json"


class ClientGone(Exception):
    """The client disconnected before its body arrived: nothing to answer."""


class FastEmbeddings:
    """Answers ``POST /v1/embeddings`` (:meth:`handles` says which requests are its): called by
    :class:`ServedApp` before FastAPI sees the request."""

    def __init__(
        self,
        *,
        answer: Callable[[EmbeddingsRequest], Awaitable[dict]],
        api_key: str | None,
        metrics: Metrics,
        max_bytes: int,
    ) -> None:
        self.answer, self.metrics, self.max_bytes = answer, metrics, max_bytes
        self.api_key = None if api_key is None else api_key.encode()
        # status -> its counter child (labels() takes a lock and builds a dict on every call)
        self._requests: dict[int, Any] = {}
        self._latency = metrics.latency.labels(endpoint=PATH)

    @staticmethod
    def handles(scope) -> bool:
        return scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "POST"

    async def __call__(self, scope, receive, send) -> None:
        started = time.perf_counter()
        status = 500
        try:
            status, body, headers = await self._respond(scope, receive)
            head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            head += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
            await send({"type": "http.response.start", "status": status, "headers": head})
            await send({"type": "http.response.body", "body": body})
        except ClientGone:
            status = 499  # nginx's "client closed request": counted, never sent
        finally:
            counter = self._requests.get(status)
            if counter is None:
                counter = self.metrics.requests.labels(endpoint=PATH, status=str(status))
                self._requests[status] = counter
            counter.inc()
            self._latency.observe(time.perf_counter() - started)

    async def _respond(self, scope, receive) -> tuple[int, bytes, dict[str, str] | None]:
        length = content_type = authorization = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"content-type":
                content_type = value
            elif name == b"authorization":
                authorization = value
        try:
            self._authorize(authorization)
            if length is not None and length.isdigit() and int(length) > self.max_bytes:
                raise body_too_large(int(length), self.max_bytes)
            body = await self._body(receive)
            if content_type is not None and not _is_json(content_type):
                raise ApiError(422, NOT_JSON)
            request = EmbeddingsRequest.model_validate_json(body)  # a ValidationError is mapped: 422
            return 200, json_bytes(await self.answer(request)), None
        except ClientGone:
            raise
        except Exception as exc:  # the service's one error mapping, as the FastAPI routes use
            error = api_error(exc)
            return error.status, json_bytes(error.body()), error.headers

    def _authorize(self, header: bytes | None) -> None:
        """401 unless the request carries ``Authorization: Bearer <key>`` (limits.RequireKey's rule)."""
        if self.api_key is not None and not key_matches(header, self.api_key):
            raise key_error()

    async def _body(self, receive) -> bytes:
        """The whole body, refused (413) as soon as it passes the limit (a chunked upload has no
        Content-Length to check up front)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise body_too_large(size, self.max_bytes)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class ServedApp(FastAPI):
    """The FastAPI app, with ``POST /v1/embeddings`` answered by :attr:`fast_embeddings` (when set)
    before any of FastAPI's own layers: its telemetry check, Starlette's error and exception
    middleware, the body limit, and the app's own middleware, each a coroutine and a wrapped
    ``send`` per request."""

    fast_embeddings: FastEmbeddings | None = None

    async def __call__(self, scope, receive, send) -> None:
        fast = self.fast_embeddings
        if fast is not None and fast.handles(scope):
            await fast(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def _is_json(content_type: bytes) -> bool:
    """``application/json`` or ``application/<anything>+json``, parameters aside (FastAPI's rule)."""
    kind = content_type.split(b";", 1)[0].strip().lower()
    return kind == b"application/json" or (kind.startswith(b"application/") and kind.endswith(b"+json"))
