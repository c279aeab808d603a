"""The service's limits enforced on the wire: a request body's size (``LimitBody``) and the API key
(``RequireKey``). The limits themselves are ServeSettings (_settings/serve.py)."""

from __future__ import annotations

import json


class LimitBody:
    """ASGI middleware: refuse a request body over ``max_bytes`` with 413, by its Content-Length
    or, for chunked uploads (no Content-Length), as soon as the bytes received pass the limit.

    A chunked body is read here, up to the limit, before the app sees it, and handed on whole: an
    error raised inside the app's own body reading would reach FastAPI's parser, which answers any
    of them with 400 "There was an error parsing the body". A body with a Content-Length cannot be
    longer than it (the HTTP server frames it), so it goes through untouched."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > self.max_bytes:
                await self._refuse(send, int(declared))
                return
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: nobody to answer
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(send, size)
                return
            if not message.get("more_body", False):
                break
        whole = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay():
            return whole.pop() if whole else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send, size: int) -> None:
        body = json.dumps(body_too_large(size, self.max_bytes).body()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def body_too_large(size: int, max_bytes: int):
    """The 413 of a body of ``size`` bytes (or more: it was cut off there) over ``max_bytes``."""
    from ._responses import ApiError

    return ApiError(
        413,
        f"the request body has {size:,} bytes or more; this server takes at most {max_bytes:,} "
        "(--max-body-mb): split the inputs over several requests",
        code="request_too_large",
    )


# Paths anyone may read: liveness, the API's description, the explorer's static page and assets.
PUBLIC_PATHS = frozenset({"/health", "/", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
PUBLIC_PREFIXES = ("/explore/", "/docs-assets/")


def key_error():
    from ._responses import ApiError

    return ApiError(
        401,
        "missing or wrong API key: send 'Authorization: Bearer <key>'",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def key_matches(header: bytes | None, key: bytes) -> bool:
    """``Authorization: Bearer <key>``, compared in constant time."""
    import hmac

    scheme, _, given = (header or b"").partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), key)


class RequireKey:
    """ASGI middleware: with an API key set, every path but the public ones answers 401 without it,
    before its body is read, parsed or validated (a stranger learns nothing of the request schema)."""

    def __init__(self, app, api_key: str | None) -> None:
        self.app, self.key = app, None if api_key is None else api_key.encode()

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if (
            self.key is None
            or scope["type"] != "http"
            or path in PUBLIC_PATHS
            or path.startswith(PUBLIC_PREFIXES)
            or key_matches(dict(scope.get("headers") or []).get(b"authorization"), self.key)
        ):
            await self.app(scope, receive, send)
            return
        error = key_error()
        body = json.dumps(error.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in (error.headers or {}).items()]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
