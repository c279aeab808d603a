"""The service's settings and limits: sizes, queue, API key, long-text policy."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .._features.names import LongTexts, check_long_texts
from ..errors import OptionError

API_KEY_ENV = "LAYERWISE_API_KEY"


MAX_LIMIT = 2**40  # a count or byte size past this is no limit: a typo, or inf


@dataclass(frozen=True)
class ServeSettings:
    """Limits of one server. A request over a size limit gets 413, a full queue 429."""

    api_key: str | None = None
    max_body_bytes: int = 8 * 2**20  # a request body
    max_inputs: int = 2048  # texts, pairs or word lists per request
    max_request_tokens: int = 131_072  # tokens per request, after tokenisation
    max_batch_tokens: int = 16_384  # tokens gathered for one model run
    # how long the oldest request waits for others to join its run. With two streams a longer wait
    # gathers every client into one run on one stream: at 8 clients 5 ms kept one core busy (0.4x
    # offline tokens/s) where 2 ms kept both (0.56x); at 32 clients 1, 2 and 5 ms were alike (0.78-
    # 0.82x; interleaved A/B, docs/serving-performance.md). A lone client never waits
    # (Batcher._wait_left)
    max_wait_ms: float = 2.0
    max_queue_tokens: int = 1_048_576  # tokens waiting before 429
    # the vectors a response carries, counted before any work (one row per token at token and word
    # level, one per input at sentence level; base64 in JSON is 4/3 of that): 413 beyond
    max_response_bytes: int = 64 * 2**20
    # the vectors of the requests queued and running: 429 beyond (a lone request always runs)
    max_queue_bytes: int = 512 * 2**20
    # tokens of one /v1/explore/* text (its windows, every layer): 413 beyond
    max_explore_tokens: int = 2048
    # a slow client is cut (408) when its request's headers, then its body, take longer than these
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    # inputs over the model maximum where a request does not say: truncate | window (of stride)
    long_texts: LongTexts = "truncate"
    stride: int | None = None
    # model runs at once, each on its share of torch's threads (None: 1 in-process; in the model
    # process the default of extraction, streams.default_streams)
    streams: int | None = None
    # run the models in a process of their own (model_process.py): the event loop does not hold
    # their GIL; CPU only (``layerwise serve`` turns it on there)
    model_process: bool = False

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_inputs",
            "max_request_tokens",
            "max_batch_tokens",
            "max_queue_tokens",
            "max_response_bytes",
            "max_queue_bytes",
            "max_explore_tokens",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
                raise OptionError(f"{name}={value!r} must be a whole number from 1 to {MAX_LIMIT:,} (2**40)")
        if self.max_request_tokens > self.max_queue_tokens:
            raise OptionError(
                f"max_request_tokens={self.max_request_tokens} is larger than max_queue_tokens="
                f"{self.max_queue_tokens}: such a request could never be queued; raise the queue limit"
            )
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
                raise OptionError(f"{name}={value!r}: use a number of seconds above 0, at most 3600")
        if not 0 <= self.max_wait_ms <= 1000:
            raise OptionError(f"max_wait_ms={self.max_wait_ms!r}: use 0 to 1000 (a few ms is typical)")
        if self.streams is not None and (
            isinstance(self.streams, bool) or not isinstance(self.streams, int) or self.streams < 1
        ):
            raise OptionError(f"streams={self.streams!r} must be a whole number >= 1 (or None)")
        check_long_texts(self.long_texts, self.stride)
        if self.api_key is not None and len(self.api_key) < 8:
            raise OptionError("the API key is shorter than 8 characters; use a long random one")


def read_api_key(path: str | os.PathLike | None) -> str | None:
    """The API key from a file (first line), else from $LAYERWISE_API_KEY, else None. Never from the
    command line, where ``ps`` shows it to every user of the machine."""
    if path is not None:
        path = Path(path)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise OptionError(f"--api-key-file {str(path)!r} cannot be read: {exc.strerror}") from None
        key = lines[0].strip() if lines else ""
        if not key:
            raise OptionError(f"--api-key-file {str(path)!r} is empty; write the key on its first line")
        return key
    key = os.environ.get(API_KEY_ENV, "").strip()
    return key or None


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
