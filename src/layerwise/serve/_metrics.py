"""Prometheus metrics of the service (``GET /metrics``), one registry per app."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]

ENDPOINTS = ("/v1/embeddings", "/v1/layers", "/v1/models", "/health", "/metrics")


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter(
            "layerwise_requests",
            "HTTP requests by endpoint and status code",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "layerwise_request_seconds",
            "Request latency, arrival to last byte, by endpoint",
            ["endpoint"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.batch_requests = Histogram(
            "layerwise_batch_requests",
            "Requests merged into one model run",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=self.registry,
        )
        self.batch_inputs = Histogram(
            "layerwise_batch_inputs",
            "Inputs (texts, pairs, word lists) in one model run",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=self.registry,
        )
        self.queue_requests = Gauge(
            "layerwise_queue_requests", "Requests waiting for the model", registry=self.registry
        )
        self.queue_tokens = Gauge(
            "layerwise_queue_tokens", "Tokens waiting for the model", registry=self.registry
        )
        self.queue_wait = Histogram(
            "layerwise_queue_wait_seconds",
            "Seconds a request waited in the queue, from its arrival there to the start of its run",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.tokens = Counter(
            "layerwise_tokens", "Tokens run through the model", ["model"], registry=self.registry
        )
        self.run_seconds = Histogram(
            "layerwise_run_seconds",
            "Seconds of one model run (merged requests)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.tokens_per_second = Gauge(
            "layerwise_tokens_per_second", "Tokens/s of the last model run", registry=self.registry
        )

    def observe_run(self, model: str, n_requests: int, n_inputs: int, n_tokens: int, seconds: float) -> None:
        self.batch_requests.observe(n_requests)
        self.batch_inputs.observe(n_inputs)
        self.tokens.labels(model=model).inc(n_tokens)
        self.run_seconds.observe(seconds)
        if seconds > 0:
            self.tokens_per_second.set(n_tokens / seconds)

    def observe_waits(self, seconds: Iterable[float]) -> None:
        for wait in seconds:
            self.queue_wait.observe(wait)

    def observe_queue(self, n_requests: int, n_tokens: int) -> None:
        self.queue_requests.set(n_requests)
        self.queue_tokens.set(n_tokens)

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class ObserveRequests:
    """ASGI middleware: count every HTTP response by endpoint and status, time it."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"  # bounded label values
        started = time.perf_counter()
        status = 500

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            self.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()
            self.metrics.latency.labels(endpoint=endpoint).observe(time.perf_counter() - started)
