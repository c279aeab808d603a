"""One error mapping: every error case of the README, sent to both /v1/embeddings (the fast path in
front of FastAPI) and /v1/layers (a FastAPI route), gets the same status, ``type`` and ``param``;
an unexpected exception is a 500 in the error shape with a request id that the log line names too,
counted in /metrics."""

from __future__ import annotations

import asyncio
import logging

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from test_serve import run_app  # noqa: E402

from layerwise.serve import ServeSettings, create_app  # noqa: E402

KEY = "test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {"content-type": "application/json", **AUTH}

# name -> (fields of both bodies, expected status, expected param); the embeddings body holds
# {"input": "x", **fields}, the layers body {"texts": ["x"], "pool": "sentence:mean", **fields}
CASES = {
    "layer 99": ({"layers": "99"}, 422, "layers"),
    "layer abc": ({"layers": "abc"}, 422, "layers"),
    "layer -99": ({"layers": "-99"}, 422, "layers"),
    "range 9-12 fused": ({"layers": "9-12", "fuse": "mean"}, 422, "layers"),
    "layers past the model": ({"layers": [0, 7]}, 422, "layers"),
    "unknown fusion": ({"fuse": "median"}, 422, "fuse"),
    "unknown pool": ({"pool": "sentence:median"}, 422, "pool"),
    "unknown field": ({"layer": "1"}, 422, "layer"),
    "wrong type": ({"normalize": "yes"}, 422, "normalize"),
    "model not served": ({"model": "../../etc/passwd"}, 404, "model"),
    "hub name not served": ({"model": "bert-base-uncased"}, 404, "model"),
}
RAW_CASES = {  # bodies as bytes, the same for both endpoints
    "malformed JSON": (b'{"x": [', 422),
    "nested 10,000 deep": (b'{"x": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", 422),
    "NaN literal": (b'{"x": "a", "dimensions": NaN}', 422),
    "not an object": (b"[1, 2]", 422),
    "too large": (b'{"x": "' + b"a" * 40_000 + b'"}', 413),
}


@pytest.fixture
def app(tiny_encoder):
    settings = ServeSettings(api_key=KEY, max_body_bytes=30_000, max_inputs=3, max_request_tokens=40)
    return create_app({"tiny": tiny_encoder}, settings)


def test_every_error_case_answers_alike_on_both_endpoints(app):
    async def scenario(client):
        out = {}
        for name, (fields, _, _) in CASES.items():
            layers_body = {"texts": ["x"], "pool": "sentence:mean", **fields}
            out[name] = (
                await client.post("/v1/embeddings", json={"input": "x", **fields}, headers=AUTH),
                await client.post("/v1/layers", json=layers_body, headers=AUTH),
            )
        for name, (body, _) in RAW_CASES.items():
            out[name] = (
                await client.post("/v1/embeddings", content=body.replace(b'"x"', b'"input"'), headers=JSON),
                await client.post("/v1/layers", content=body.replace(b'"x"', b'"texts"'), headers=JSON),
            )
        out["empty list"] = (
            await client.post("/v1/embeddings", json={"input": []}, headers=AUTH),
            await client.post("/v1/layers", json={"texts": []}, headers=AUTH),
        )
        out["too many inputs"] = (
            await client.post("/v1/embeddings", json={"input": ["a"] * 4}, headers=AUTH),
            await client.post("/v1/layers", json={"texts": ["a"] * 4}, headers=AUTH),
        )
        out["too many tokens"] = (
            await client.post("/v1/embeddings", json={"input": ["word " * 50]}, headers=AUTH),
            await client.post("/v1/layers", json={"texts": ["word " * 50]}, headers=AUTH),
        )
        out["no key"] = (
            await client.post("/v1/embeddings", json={"input": "x"}),
            await client.post("/v1/layers", json={"texts": ["x"]}),
        )
        out["key in the query string"] = (
            await client.post(f"/v1/embeddings?api_key={KEY}", json={"input": "x"}),
            await client.post(f"/v1/layers?api_key={KEY}", json={"texts": ["x"]}),
        )
        return out

    out = run_app(app, scenario)
    expected = {name: (status, param) for name, (_, status, param) in CASES.items()}
    expected |= {name: (status, None) for name, (_, status) in RAW_CASES.items()}
    expected |= {"empty list": (422, "texts"), "too many inputs": (413, None), "too many tokens": (413, None)}
    expected |= {"no key": (401, None), "key in the query string": (401, None)}
    for name, (embeddings, layers) in out.items():
        status, param = expected[name]
        a, b = embeddings.json()["error"], layers.json()["error"]
        assert (embeddings.status_code, layers.status_code) == (status, status), (name, a, b)
        assert a["type"] == b["type"] == ("invalid_request_error" if status < 500 else "server_error"), name
        param_a = "texts" if a["param"] == "input" else a["param"]  # the same field under its two names
        if name not in RAW_CASES:  # raw bodies: the JSON position, not a field
            assert param_a == b["param"] == param, (name, a, b)
        assert a["code"] == b["code"], (name, a, b)
    layer = out["layer 99"][0].json()["error"]["message"]
    assert layer.startswith("layer 99 out of range: this model has 4 hidden states")


def test_an_unexpected_exception_is_a_500_with_a_request_id_in_the_log(tiny_encoder, caplog):
    app = create_app({"tiny": tiny_encoder})
    runner = app.state.batcher.runner

    def broken(slot, run):
        raise ZeroDivisionError("a bug")

    runner.start = broken

    async def scenario(client):
        return (
            await client.post("/v1/embeddings", json={"input": "a"}),
            await client.post("/v1/layers", json={"texts": ["a"]}),
            await client.get("/metrics"),
        )

    with caplog.at_level(logging.ERROR, logger="layerwise"):
        fast, route, metrics = run_app(app, scenario)
    for response in (fast, route):
        error = response.json()["error"]
        assert (
            response.status_code == 500
            and error["type"] == "server_error"
            and error["code"] == "internal_error"
        )
        request_id = response.headers["x-request-id"]
        assert request_id in error["message"] and f"request {request_id} failed" in caplog.text
    assert 'layerwise_requests_total{endpoint="/v1/embeddings",status="500"} 1.0' in metrics.text
    assert 'layerwise_requests_total{endpoint="/v1/layers",status="500"} 1.0' in metrics.text


def test_model_names_that_look_like_paths_never_load_anything(app, monkeypatch):
    import layerwise._encoder

    def no_loading(*args, **kwargs):
        raise AssertionError("a request made the server load a model")

    monkeypatch.setattr(layerwise._encoder.Encoder, "__init__", no_loading)

    async def scenario(client):
        names = ["../x", "/etc", "/etc/passwd", "bert-base-uncased", "tiny/../tiny", "~", "."]
        return [
            await client.post("/v1/embeddings", json={"input": "x", "model": n}, headers=AUTH) for n in names
        ]

    assert {r.status_code for r in run_app(app, scenario)} == {404}


def test_texts_with_lone_surrogates_and_nul_bytes(app):
    async def scenario(client):
        return (
            await client.post("/v1/embeddings", content=b'{"input": "a\\ud800b"}', headers=JSON),
            await client.post("/v1/layers", content=b'{"texts": ["a\\ud800b"]}', headers=JSON),
            await client.post("/v1/embeddings", json={"input": "a\x00b"}, headers=AUTH),
            await client.post("/v1/layers", json={"texts": ["a\x00b"]}, headers=AUTH),
        )

    lone_fast, lone_route, nul_fast, nul_route = run_app(app, scenario)
    assert lone_fast.status_code == lone_route.status_code == 422
    assert nul_fast.status_code == nul_route.status_code == 200


def test_a_client_gone_mid_body_or_mid_response_leaves_the_server_serving(tiny_encoder):
    import socket

    from conftest import running_server

    app = create_app({"tiny": tiny_encoder}, ServeSettings(max_wait_ms=0))
    with running_server(app) as url:
        port = int(url.rsplit(":", 1)[1])
        for path in ("/v1/embeddings", "/v1/layers"):
            with socket.create_connection(("127.0.0.1", port)) as sock:  # gone mid-body
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{{".encode())
            with socket.create_connection(("127.0.0.1", port)) as sock:  # gone before reading the answer
                body = b'{"texts": ["' + b"word " * 20 + b'"], "layers": "all"}'
                head = f"POST /v1/layers HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                sock.sendall(head.encode() + b"content-type: application/json\r\n\r\n" + body)
        after = httpx.post(f"{url}/v1/layers", json={"texts": ["still here"]}, timeout=30)
        health = httpx.get(f"{url}/health", timeout=30)
    assert after.status_code == 200 and health.json()["status"] == "ok"


def rss_mib() -> float:
    from pathlib import Path

    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_64_clients_for_15_seconds_with_bad_requests_mixed_in(tiny_encoder):
    """64 clients for 15 s, one request in ten a bad one: every good request gets 200 and its own
    vector, every bad one its 4xx, and the process's memory stays bounded."""
    import time

    import numpy as np

    app = create_app({"tiny": tiny_encoder}, ServeSettings(max_wait_ms=5))
    texts = [f"client text {i} about the bank" for i in range(64)]
    want = tiny_encoder.encode(texts)
    bad_bodies = [
        {"input": "x", "layers": "99"},
        {"input": []},
        {"input": "x", "model": "nope"},
        {"inputs": "x"},
    ]

    async def scenario(client):
        results: dict = {"good": 0, "bad": 0, "wrong": [], "rss": []}
        deadline = time.perf_counter() + 15

        async def one_client(k: int) -> None:
            n = 0
            while time.perf_counter() < deadline:
                n += 1
                if (k + n) % 10 == 0:
                    response = await client.post("/v1/embeddings", json=bad_bodies[(k + n) % len(bad_bodies)])
                    ok = 400 <= response.status_code < 500 and "error" in response.json()
                    results["bad"] += 1
                else:
                    response = await client.post("/v1/embeddings", json={"input": texts[k]})
                    good = response.status_code == 200
                    ok = good and np.allclose(response.json()["data"][0]["embedding"], want[k], atol=1e-5)
                    results["good"] += 1
                if not ok:
                    results["wrong"].append((k, response.status_code, response.text[:200]))

        async def watch() -> None:
            while time.perf_counter() < deadline:
                results["rss"].append(rss_mib())
                await asyncio.sleep(1)

        await asyncio.gather(watch(), *(one_client(k) for k in range(64)))
        return results

    results = run_app(app, scenario)
    assert results["wrong"] == []
    assert results["good"] > 500 and results["bad"] > 50
    rss = results["rss"]
    assert max(rss[len(rss) // 3 :]) - rss[len(rss) // 3] < 200  # flat once warm (MiB)


def test_the_input_limit_answers_and_the_server_lives(tiny_encoder):
    app = create_app({"tiny": tiny_encoder})  # the default --max-inputs, 2,048

    async def scenario(client):
        return (
            await client.post("/v1/embeddings", json={"input": ["a"] * 2048}),
            await client.post("/v1/embeddings", json={"input": ["a"] * 2049}),
            await client.post("/v1/layers", json={"texts": ["a"] * 2049}),
            await client.post("/v1/embeddings", content=b'{"input": "a", "dimensions": Infinity}',
                              headers={"content-type": "application/json"}),
            await client.get("/health"),
        )  # fmt: skip

    full, over, over_layers, infinity, health = run_app(app, scenario)
    assert full.status_code == 200 and len(full.json()["data"]) == 2048
    assert over.status_code == over_layers.status_code == 413
    assert "at most 2,048 (--max-inputs)" in over.json()["error"]["message"]
    assert infinity.status_code == 422 and health.json()["status"] == "ok"
