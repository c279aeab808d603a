"""The service's trust boundaries: one request's failure stays its own, every request is bounded
(tokens, response size, queued bytes, explorer texts, slow clients), authentication comes before
the body is read, and empty or too-deep bodies get a 422 in the error shape."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from conftest import running_server  # noqa: E402
from test_serve import run_app  # noqa: E402

import layerwise as lw  # noqa: E402
from layerwise._inputs.encoding import InputEncoder  # noqa: E402
from layerwise.serve import ServeSettings, create_app  # noqa: E402

KEY = "test-key-0123456789"


def poisoned_encoder(folder, *, checked: bool) -> lw.Encoder:
    """The tiny model with a tokenizer that knows one more word than the model has rows for:
    "zzpoison" becomes id 30522 of a 30522-row embedding table (a tokenizer and a model that do
    not belong together). ``checked``: with the encode-time vocabulary check, else without it (so
    that the id reaches the model run and fails it)."""
    encoder = lw.Encoder(folder, device="cpu")
    backend = encoder.tokenizer.backend_tokenizer
    from tokenizers import AddedToken, Tokenizer

    extended = Tokenizer.from_str(backend.to_str())
    extended.add_tokens([AddedToken("zzpoison", single_word=True)])
    assert extended.token_to_id("zzpoison") == encoder.config.vocab_size
    vocab = encoder.config.vocab_size if checked else None
    encoder.inputs = InputEncoder(extended, encoder.max_length, vocab_size=vocab)
    return encoder


@pytest.mark.parametrize("checked", [False, True])
def test_one_poisoned_request_among_32_fails_alone(make_tiny_model, checked):
    """31 good requests and 1 poisoned one, concurrently, merged into shared runs: the 31 get the
    vectors an offline extraction gives; the poisoned one gets its own error (422 when the
    vocabulary check catches it at encode time, else 500 after the batcher re-ran the run apart)."""
    encoder = poisoned_encoder(make_tiny_model("bert"), checked=checked)
    app = create_app({"tiny": encoder}, ServeSettings(max_wait_ms=200))
    texts = [f"client {i} asks about the river bank" for i in range(32)]
    texts[17] = "client 17 sends zzpoison"

    async def scenario(client):
        responses = await asyncio.gather(*(client.post("/v1/embeddings", json={"input": t}) for t in texts))
        return responses, await client.get("/metrics")

    responses, metrics = run_app(app, scenario)
    poisoned = responses[17]
    if checked:
        assert poisoned.status_code == 422
        assert "tokenizer and model disagree" in poisoned.json()["error"]["message"]
    else:
        assert poisoned.status_code == 500
        assert poisoned.json()["error"]["code"] == "internal_error" and poisoned.headers["x-request-id"]
        assert "IndexError" in poisoned.json()["error"]["message"]
        merged = float(metrics.text.split("layerwise_batch_requests_sum ")[1].split()[0])
        runs = float(metrics.text.split("layerwise_batch_requests_count ")[1].split()[0])
        assert merged > runs  # some run held several requests, and was re-run apart
    good = [t for i, t in enumerate(texts) if i != 17]
    want = lw.Encoder(make_tiny_model("bert"), device="cpu").encode(good)
    got = [r.json()["data"][0]["embedding"] for i, r in enumerate(responses) if i != 17]
    assert all(r.status_code == 200 for i, r in enumerate(responses) if i != 17)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def test_empty_lists_and_deep_json_are_422_in_the_error_shape(tiny_encoder):
    app = create_app({"tiny": tiny_encoder})
    deep = b'{"texts": ' + b"[" * 3000 + b"]" * 3000 + b"}"

    async def scenario(client):
        return {
            "texts": await client.post("/v1/layers", json={"texts": []}),
            "words": await client.post("/v1/layers", json={"words": []}),
            "pairs": await client.post("/v1/layers", json={"pairs": []}),
            "input": await client.post("/v1/embeddings", json={"input": []}),
            "deep": await client.post(
                "/v1/layers", content=deep, headers={"content-type": "application/json"}
            ),
            "deep_fast": await client.post(
                "/v1/embeddings",
                content=deep.replace(b"texts", b"input"),
                headers={"content-type": "application/json"},
            ),
            "after": await client.post("/v1/layers", json={"texts": ["still served"]}),
        }

    out = run_app(app, scenario)
    for field in ("texts", "words", "pairs"):
        assert out[field].status_code == 422, out[field].text
        error = out[field].json()["error"]
        assert error["param"] == field and f"{field} is an empty list" in error["message"]
    assert out["input"].status_code == 422 and "empty list" in out["input"].json()["error"]["message"]
    for name in ("deep", "deep_fast"):
        assert out[name].status_code == 422, out[name].text
        assert set(out[name].json()["error"]) == {"message", "type", "param", "code"}
    assert out["after"].status_code == 200


def test_authentication_comes_before_the_body_on_every_route(tiny_encoder):
    app = create_app({"tiny": tiny_encoder}, ServeSettings(api_key=KEY))
    garbage = {"content": b'{"texts": [', "headers": {"content-type": "application/json"}}
    routes = [
        ("POST", "/v1/embeddings"), ("POST", "/v1/layers"), ("GET", "/v1/models"), ("GET", "/metrics"),
        ("POST", "/v1/explore/tokens"), ("POST", "/v1/explore/lens"), ("GET", "/v1/explore/info"),
        ("POST", "/v1/nothing-here"),
    ]  # fmt: skip

    async def scenario(client):
        answers = [await client.request(method, path, **garbage) for method, path in routes]
        public = [await client.get(path) for path in ("/health", "/openapi.json", "/")]
        return answers, public

    answers, public = run_app(app, scenario)
    for (_, path), response in zip(routes, answers, strict=True):
        assert response.status_code == 401, (path, response.text)
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert "loc" not in response.text and "texts" not in response.text  # nothing of the schema
    assert [r.status_code for r in public] == [200, 200, 200]


def test_explorer_texts_are_bounded_and_go_through_the_batcher(tiny_encoder):
    app = create_app({"tiny": tiny_encoder}, ServeSettings(max_explore_tokens=300))
    long_text = "的" * 100_000

    async def scenario(client):
        started = time.perf_counter()
        refused = await client.post("/v1/explore/tokens", json={"text": long_text})
        seconds = time.perf_counter() - started
        lens = await client.post("/v1/explore/attention", json={"text": long_text, "layer": 1})
        fine = await client.post(
            "/v1/explore/tokens", json={"text": "the bank " * 100}
        )  # 202 tokens: windows
        # the batcher answers a request before it records the run's metrics: give it a moment
        for _ in range(100):
            metrics = await client.get("/metrics")
            if "layerwise_batch_requests_count 1.0" in metrics.text:
                break
            await asyncio.sleep(0.05)
        return refused, seconds, lens, fine, metrics

    refused, seconds, attention, fine, metrics = run_app(app, scenario)
    assert refused.status_code == 413 and seconds < 5
    assert "100,002 tokens; this server takes at most 300 per request (--max-explore-tokens)" in refused.text
    assert attention.status_code == 413 and "the explorer takes at most 300" in attention.text
    assert fine.status_code == 200 and len(fine.json()["tokens"]) == 202
    stack = tiny_encoder.extract(["the bank " * 100], long_texts="window")[0]
    assert fine.json()["tokens"] == list(stack.tokens)
    assert "layerwise_batch_requests_count 1.0" in metrics.text  # the one text was a batcher run


def test_a_response_over_the_size_bound_is_413_pointing_to_npz_and_stores(tiny_encoder):
    # the tiny model: 4 hidden states x 32 floats per token; 30 tokens: 15,360 bytes of float32
    app = create_app({"tiny": tiny_encoder}, ServeSettings(max_response_bytes=16_000))
    text = " ".join(["word"] * 28)  # 30 tokens with [CLS] and [SEP]

    async def scenario(client):
        body = {"texts": [text], "layers": "all"}
        return (
            await client.post("/v1/layers", json=body),  # base64: 20,480 bytes
            await client.post("/v1/layers", json=body, headers={"accept": "application/x-npz"}),  # 15,360
            await client.post("/v1/layers", json={**body, "dtype": "float16"}),  # 10,240
        )

    as_json, as_npz, as_half = run_app(app, scenario)
    assert as_json.status_code == 413 and as_json.json()["error"]["code"] == "response_too_large"
    message = as_json.json()["error"]["message"]
    assert "answers at most 0 MiB (--max-response-mb)" in message and "application/x-npz" in message
    assert "layerwise extract INPUT -o corpus.lw" in message
    assert as_npz.status_code == 200 and as_half.status_code == 200


def test_queued_result_bytes_are_admitted_up_to_a_bound(tiny_encoder):
    from layerwise.serve._batcher import Batcher, Finish, Job, QueueFullError

    batcher = Batcher({"tiny": tiny_encoder}, max_queue_bytes=1000)  # not started: jobs stay queued
    encoded = tiny_encoder.tokenize(["one"])
    batcher.submit(Job("tiny", encoded, Finish((0,)), lambda r, e: None, n_bytes=5000))  # a lone one runs
    with pytest.raises(QueueFullError, match="MiB of results queued or being computed"):
        batcher.submit(Job("tiny", encoded, Finish((0,)), lambda r, e: None, n_bytes=10))


def test_slow_clients_are_cut_after_the_header_and_body_timeouts(tiny_encoder):
    from layerwise.serve._protocol import uvicorn_config

    settings = ServeSettings(header_timeout_s=0.5, body_timeout_s=0.5)
    app = create_app({"tiny": tiny_encoder}, settings)

    def talk(port: int, first: bytes) -> tuple[bytes, float]:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(first)
            started, received = time.perf_counter(), b""
            while chunk := sock.recv(4096):
                received += chunk
            return received, time.perf_counter() - started

    with running_server(app, uvicorn_config(app, "127.0.0.1", 0, settings)) as url:
        port = int(url.rsplit(":", 1)[1])
        silent, t0 = talk(port, b"")
        headers, t1 = talk(port, b"POST /v1/layers HTTP/1.1\r\nHost: x\r\nContent-Ty")
        body, t2 = talk(port, b'POST /v1/layers HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"texts"')
        ok = httpx.post(f"{url}/v1/layers", json={"texts": ["fine"]}, timeout=30)
    for answer, seconds in ((silent, t0), (headers, t1), (body, t2)):
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
        assert 0.3 < seconds < 5
    assert b"request_timeout" in headers and b"headers did not arrive within 0.5 s" in headers
    assert b"body did not arrive within 0.5 s" in body
    assert ok.status_code == 200 and json.loads(ok.text)["results"]
