"""Slow clients are cut: a request's headers, then its body, must arrive within a time limit.

uvicorn arms no timer while a request is being read: a connection that sends half a header line,
or a Content-Length and then a trickle of bytes, stays open for ever, and a few hundred such hold
the server's sockets and memory (400 connections with unfinished headers or bodies were all still
open after 70 s). :class:`BoundedProtocol` is uvicorn's httptools protocol with two timers: from
the connection (or the first byte of a keep-alive request) to the end of its headers
(``header_timeout``), and from there to the end of its body (``body_timeout``). A client that misses
one gets ``408 Request Timeout`` and the connection is closed; the app sees a disconnect.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s"
)


def bounded_protocol(header_timeout: float, body_timeout: float) -> type:
    """An HttpToolsProtocol class with these limits (uvicorn takes a class for ``http=``)."""

    class Bounded(BoundedProtocol):
        pass

    Bounded.header_timeout, Bounded.body_timeout = header_timeout, body_timeout
    return Bounded


class BoundedProtocol(HttpToolsProtocol):
    header_timeout: float = 10.0
    body_timeout: float = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading: asyncio.TimerHandle | None = None

    def _arm(self, seconds: float, phase: str) -> None:
        self._disarm()
        self._reading = self.loop.call_later(seconds, self._cut, phase, seconds)

    def _disarm(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None

    def _cut(self, phase: str, seconds: float) -> None:
        self._reading = None
        if self.transport.is_closing():
            return
        message = (
            f'{{"error": {{"message": "the request\'s {phase} did not arrive within {seconds:g} s; '
            f'send the whole request at once", "type": "invalid_request_error", "param": null, '
            f'"code": "request_timeout"}}}}'
        ).encode()
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(TIMEOUT_RESPONSE % (len(message), message))
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout, "headers")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.header_timeout, "headers")

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.body_timeout, "body")

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def uvicorn_config(application: Any, host: str, port: int, settings: Any) -> Any:
    """uvicorn's settings for ``layerwise serve``: the bounded protocol with ``settings``' timeouts
    (ServeSettings), warnings only, 30 s to finish requests in flight on SIGTERM."""
    import uvicorn

    return uvicorn.Config(
        application,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=30,
        http=bounded_protocol(settings.header_timeout_s, settings.body_timeout_s),
    )
