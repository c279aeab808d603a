"""`layerwise serve`: OpenAI client parity, per-layer endpoint, limits, batching, shutdown."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from conftest import run_app, running_server  # noqa: E402

import layerwise as lw  # noqa: E402
from layerwise.serve import ServeSettings, create_app  # noqa: E402

TEXTS = ["The bank raised rates.", "She sat on the river bank.", "ok", "A much longer sentence " * 6]
KEY = "test-key-0123456789"


@pytest.fixture(scope="module")
def served(default_encoder, make_tiny_model):
    """A real uvicorn on 127.0.0.1 (ephemeral port) serving the default and a tiny model."""
    tiny = lw.Encoder(make_tiny_model("bert"), device="cpu")
    app = create_app({default_encoder.name: default_encoder, "tiny": tiny}, ServeSettings(api_key=KEY))
    with running_server(app) as url:
        yield url, tiny


def decode(array: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(array["data"]), dtype=array["dtype"]).reshape(array["shape"])


def test_openai_client_gets_sentence_transformers_vectors(served, default_encoder, default_model_dir):
    openai = pytest.importorskip("openai")
    st = pytest.importorskip("sentence_transformers")
    url, _ = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    response = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)  # the client asks for base64
    got = np.asarray([d.embedding for d in response.data])
    reference = st.SentenceTransformer(str(default_model_dir), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(got, reference, atol=1e-5)
    np.testing.assert_allclose(got, default_encoder.encode(TEXTS), atol=1e-5)
    assert response.usage.prompt_tokens == sum(len(s.tokens) for s in default_encoder.extract(TEXTS))
    as_floats = client.embeddings.create(model="all-MiniLM-L6-v2", input="ok", encoding_format="float")
    np.testing.assert_allclose(as_floats.data[0].embedding, got[2], atol=1e-6)
    raw = client.embeddings.create(model="all-MiniLM-L6-v2", input="ok", encoding_format="base64")
    decoded = np.frombuffer(base64.b64decode(raw.data[0].embedding), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.asarray(as_floats.data[0].embedding, dtype=np.float32))
    fused = client.embeddings.create(
        model="all-MiniLM-L6-v2",
        input=TEXTS[:2],
        extra_body={"layers": "last4", "pool": "sentence:mean", "fuse": "concat_last4", "normalize": False},
    )
    want = default_encoder.embed(TEXTS[:2], pool="mean", fuse="concat_last4")
    np.testing.assert_allclose([d.embedding for d in fused.data], want, atol=1e-5)
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.embeddings.create(model="bert-base-uncased", input="x")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong-key-123", max_retries=0).embeddings.create(
            model="tiny", input="x"
        )
    assert [m.id for m in client.models.list().data] == [default_encoder.name, "tiny"]


def test_layers_endpoint_equals_extract_as_json_and_npz(served):
    url, tiny = served
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "tiny", "texts": TEXTS, "layers": "0,-1"}
    response = httpx.post(f"{url}/v1/layers", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    data = response.json()
    want = tiny.extract(TEXTS, layers=[0, -1])
    assert data["layers"] == [0, 3] and data["pool"] == "token"
    for item, stack in zip(data["results"], want, strict=True):
        assert tuple(item["tokens"]) == stack.tokens and item["offsets"] == stack.offsets.tolist()
        assert item["word_ids"] == stack.word_ids.tolist()
        np.testing.assert_allclose(decode(item["hidden"]), stack.hidden, atol=1e-5)
    npz = httpx.post(
        f"{url}/v1/layers", json=body, headers={**headers, "Accept": "application/x-npz"}, timeout=30
    )
    assert npz.headers["content-type"] == "application/x-npz"
    z = np.load(io.BytesIO(npz.content))
    assert lw.read_npz_texts(z) == TEXTS
    for i, stack in enumerate(want):
        np.testing.assert_allclose(z[f"hidden_{i}"], stack.hidden, atol=1e-5)
    words = {
        "model": "tiny",
        "words": [["New", "York", "\u200b", "banks"]],
        "pool": "word:first",
        "dtype": "float16",
    }
    item = httpx.post(f"{url}/v1/layers", json=words, headers=headers, timeout=30).json()["results"][0]
    expected = tiny.embed_words(words=words["words"], subword="first")[0]
    assert item["words"] == words["words"][0] and item["words_empty"] == [2]
    vectors = decode(item["word_vectors"])
    assert vectors.dtype == np.float16 and vectors.shape == expected.vectors.shape
    np.testing.assert_allclose(vectors, expected.vectors, atol=2e-3)


def test_limits_answer_with_the_status_clients_expect(tiny_encoder):
    settings = ServeSettings(max_body_bytes=2000, max_inputs=3, max_request_tokens=40, max_queue_tokens=60)
    app = create_app({"tiny": tiny_encoder}, settings)

    async def scenario(client):
        out = {}
        out["body"] = await client.post("/v1/embeddings", json={"input": ["x" * 3000]})
        out["inputs"] = await client.post("/v1/embeddings", json={"input": ["a"] * 4})
        out["tokens"] = await client.post("/v1/embeddings", json={"input": ["word " * 50]})
        out["json"] = await client.post(
            "/v1/embeddings", content=b'{"input": [', headers={"content-type": "application/json"}
        )
        out["type"] = await client.post("/v1/embeddings", json={"input": "a", "encoding_format": "hex"})
        out["unknown"] = await client.post("/v1/layers", json={"texts": ["a"], "layer": "last4"})
        out["spec"] = await client.post("/v1/layers", json={"texts": ["a"], "pool": "word:median"})
        out["fuse"] = await client.post("/v1/layers", json={"texts": ["a"], "fuse": "concat_last4"})
        out["dims"] = await client.post("/v1/embeddings", json={"input": "a", "dimensions": 8})
        out["model"] = await client.post("/v1/embeddings", json={"input": "a", "model": "../../etc/passwd"})
        out["pairs"] = await client.post("/v1/layers", json={"pairs": [["a", "b", "c"]]})
        return out

    out = run_app(app, scenario)
    expect = {
        "body": (413, "takes at most 2,000"),
        "inputs": (413, "at most 3 (--max-inputs)"),
        "tokens": (413, "at most 40 per request"),
        "json": (422, "not valid JSON"),
        "type": (422, "encoding_format: Input should be 'float' or 'base64'"),
        "unknown": (422, "unknown field 'layer'"),
        "spec": (422, "pool 'word:median' is not valid; choose one of token, word:first"),
        "fuse": (422, "needs word or sentence pooling"),
        "dims": (422, "dimensions=8 is not supported: these vectors have 32 dimensions"),
        "model": (404, "not served here"),
        "pairs": (422, "must be a (first, second) tuple"),
    }
    for name, (status, fragment) in expect.items():
        response = out[name]
        assert response.status_code == status, (name, response.text)
        assert fragment in response.json()["error"]["message"], (name, response.text)


def test_full_queue_is_429_with_retry_after(tiny_encoder):
    settings = ServeSettings(max_request_tokens=25, max_queue_tokens=25)
    app = create_app({"tiny": tiny_encoder}, settings)
    runner = app.state.batcher.runner
    original = runner.collect

    def slow_collect(slot):  # the model is busy long enough for the queue to fill
        time.sleep(0.8)
        return original(slot)

    runner.collect = slow_collect
    text = "one two three four five six seven eight nine ten eleven twelve"  # 14 tokens

    async def scenario(client):
        running = asyncio.create_task(client.post("/v1/embeddings", json={"input": [text]}))
        await asyncio.sleep(0.3)
        queued = asyncio.create_task(client.post("/v1/embeddings", json={"input": [text]}))
        await asyncio.sleep(0.2)
        refused = await client.post("/v1/embeddings", json={"input": [text]})
        return await running, await queued, refused

    running, queued, refused = run_app(app, scenario)
    assert running.status_code == 200 and queued.status_code == 200
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert "queue is full (14 tokens waiting)" in refused.json()["error"]["message"]


def test_a_run_that_fails_unexpectedly_fails_its_requests_not_the_server(tiny_encoder):
    """Whatever a run raises reaches each of its requests (500); the next run is served."""
    app = create_app({"tiny": tiny_encoder})
    runner = app.state.batcher.runner
    original, calls = runner.start, []

    def failing_once(slot, run):
        calls.append(len(run.jobs))
        if len(calls) == 1:
            raise RuntimeError("a bug outside the forward")
        original(slot, run)

    runner.start = failing_once

    async def main(client):
        failed = await asyncio.wait_for(client.post("/v1/embeddings", json={"input": ["a"]}), 30)
        served = await asyncio.wait_for(client.post("/v1/embeddings", json={"input": ["a"]}), 30)
        return failed, served

    failed, served = run_app(app, main, raise_app_exceptions=False)
    assert failed.status_code == 500 and served.status_code == 200 and calls == [1, 1]


def test_api_key_is_required_and_compared(tiny_encoder, tmp_path, monkeypatch):
    from layerwise.errors import OptionError
    from layerwise.serve import read_api_key

    key_file = tmp_path / "key"
    key_file.write_text("s3cret-key-value\n", encoding="utf-8")
    assert read_api_key(key_file) == "s3cret-key-value"
    monkeypatch.setenv("LAYERWISE_API_KEY", "from-environment")
    assert read_api_key(None) == "from-environment"
    (tmp_path / "empty").write_text("", encoding="utf-8")
    with pytest.raises(OptionError, match="is empty"):
        read_api_key(tmp_path / "empty")
    app = create_app({"tiny": tiny_encoder}, ServeSettings(api_key="s3cret-key-value"))

    async def scenario(client):
        body = {"input": "a"}
        return (
            await client.post("/v1/embeddings", json=body),
            await client.post(
                "/v1/embeddings", json=body, headers={"Authorization": "Bearer s3cret-key-valuX"}
            ),
            await client.post(
                "/v1/embeddings", json=body, headers={"Authorization": "Bearer s3cret-key-value"}
            ),
            await client.get("/health"),
        )

    missing, wrong, right, health = run_app(app, scenario)
    assert (
        missing.status_code == 401
        and wrong.status_code == 401
        and missing.headers["www-authenticate"] == "Bearer"
    )
    assert right.status_code == 200 and health.status_code == 200


def test_embeddings_fast_path_answers_as_the_fastapi_route_does(tiny_encoder, monkeypatch):
    """POST /v1/embeddings is answered by FastEmbeddings, in front of FastAPI: the same statuses,
    error messages, headers, vectors and metrics as the FastAPI route it bypasses."""
    from layerwise.serve._fast_path import FastEmbeddings

    settings = ServeSettings(api_key=KEY, max_body_bytes=3000)
    fast = create_app({"tiny": tiny_encoder}, settings)
    plain = create_app({"tiny": tiny_encoder}, settings)
    plain.fast_embeddings = None  # every request through FastAPI
    answered = []
    respond = FastEmbeddings._respond

    async def counted(self, scope, receive):
        answered.append(scope["path"])
        return await respond(self, scope, receive)

    monkeypatch.setattr(FastEmbeddings, "_respond", counted)
    key = {"Authorization": f"Bearer {KEY}"}

    async def chunks():  # a chunked upload over the limit: no Content-Length to refuse it by
        for _ in range(4):
            yield b" " * 1000

    requests = [
        {"json": {"input": TEXTS, "encoding_format": "float"}, "headers": key},
        {"json": {"input": "a", "encoding_format": "base64", "fuse": "concat_last4"}, "headers": key},
        {"json": {"input": ["a"], "layers": "last2"}, "headers": key},  # two vectors per input
        {"json": {"input": []}, "headers": key},
        {"json": {"input": [1, 2]}, "headers": key},
        {"json": {"input": "a", "encoding_format": "hex", "dimensions": "8"}, "headers": key},
        {"json": {"input": "a", "layer": -1}, "headers": key},
        {"json": {"input": "a", "dimensions": 8}, "headers": key},
        {"json": {"input": "a", "model": "other"}, "headers": key},
        {"json": ["a"], "headers": key},
        {"content": b'{"input": [', "headers": {**key, "content-type": "application/json"}},
        {"content": b'{"input": "a"}', "headers": {**key, "content-type": "text/plain"}},
        {"content": b'{"input": "a"}', "headers": {**key, "content-type": "application/vnd.x+json"}},
        {"json": {"input": "x" * 4000}, "headers": key},
        {"content": chunks(), "headers": {**key, "content-type": "application/json"}},
        {"json": {"input": "a"}},
        {"json": {"input": "a"}, "headers": {"Authorization": f"Bearer {KEY}x"}},
        {"json": {"input": "a"}, "headers": {"Authorization": f"Basic {KEY}"}},
    ]

    def scenario_of(app):
        async def scenario(client):
            out = []
            for request in requests:
                request = dict(request)
                if request.get("content") is not None and not isinstance(request["content"], bytes):
                    request["content"] = chunks()
                out.append(await client.post("/v1/embeddings", **request))
            out.append(await client.get("/v1/embeddings", headers=key))  # 405 from FastAPI
            return out, (await client.get("/metrics", headers=key)).text

        return scenario

    got, metrics = run_app(fast, scenario_of(fast))
    assert len(answered) == len(requests)  # every POST took the fast path, the GET did not
    answered.clear()
    want, plain_metrics = run_app(plain, scenario_of(plain))
    assert answered == []
    statuses = [r.status_code for r in got]
    assert statuses == [r.status_code for r in want], [(r.status_code, r.text) for r in got]
    assert statuses == [
        200,
        200,
        422,
        422,
        422,
        422,
        422,
        422,
        404,
        422,
        422,
        422,
        200,
        413,
        413,
        401,
        401,
        401,
        405,
    ]
    for mine, theirs in zip(got, want, strict=True):
        assert mine.headers["content-type"] == theirs.headers["content-type"]
        assert mine.headers.get("www-authenticate") == theirs.headers.get("www-authenticate")
        if mine.status_code == 200:
            a, b = mine.json(), theirs.json()
            assert a["usage"] == b["usage"] and a["model"] == b["model"] == "tiny"
            for x, y in zip(a["data"], b["data"], strict=True):
                if isinstance(x["embedding"], str):
                    x["embedding"], y["embedding"] = decode_b64(x["embedding"]), decode_b64(y["embedding"])
                np.testing.assert_allclose(x["embedding"], y["embedding"], atol=1e-6)
                assert x["index"] == y["index"] and x["truncated"] == y["truncated"]
        else:  # the same error; JSON syntax errors name the parser's words for the fault
            a, b = mine.json().get("error", mine.json()), theirs.json().get("error", theirs.json())
            if a.get("message", "").startswith("the body is not valid JSON ("):
                a["message"] = b["message"] = a["message"].split(" (")[0]
                assert "line 1 column 11" in mine.json()["error"]["message"]
            assert a == b, (mine.text, theirs.text)
    np.testing.assert_allclose(
        [d["embedding"] for d in got[0].json()["data"]], tiny_encoder.encode(TEXTS), atol=1e-5
    )
    for status, count in (("200", 3), ("422", 9), ("413", 2), ("401", 3), ("404", 1)):
        line = f'layerwise_requests_total{{endpoint="/v1/embeddings",status="{status}"}} {count}.0'
        assert line in metrics and line in plain_metrics, line


def decode_b64(data: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data), dtype="<f4")


@pytest.mark.parametrize("model_process", [False, True])
def test_concurrent_clients_get_exactly_their_own_results(tiny_encoder, model_process):
    settings = ServeSettings(
        max_wait_ms=50, model_process=model_process, concurrent_forwards=2 if model_process else 1
    )
    app = create_app({"tiny": tiny_encoder}, settings)
    rng = np.random.default_rng(0)
    words = ["bank", "river", "rates", "the", "raised", "money", "water", "a", "crane", "flew"]
    settings = [
        ("all", "token", None),
        ("last2", "word:mean", None),
        (None, "sentence:mean", "concat_last4"),
        ("-1", "sentence:cls", None),
        ("0,2", "word:first_last", None),
        ("1", "sentence:max", None),
    ]
    requests = []
    for i in range(32):
        texts = [" ".join(rng.choice(words, size=rng.integers(1, 30))) for _ in range(rng.integers(1, 4))]
        requests.append((texts, *settings[i % len(settings)]))

    async def scenario(client):
        async def one(texts, layers, pool, fuse):
            body = {"model": "tiny", "texts": texts, "pool": pool, "fuse": fuse}
            if layers is not None:
                body["layers"] = layers
            return await client.post("/v1/layers", json=body)

        responses = await asyncio.gather(*(one(*r) for r in requests))
        return responses, await client.get("/metrics")

    responses, metrics = run_app(app, scenario)
    for (texts, layers, pool, fuse), response in zip(requests, responses, strict=True):
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert len(results) == len(texts)
        level, _, mode = pool.partition(":")
        if level == "token":
            for item, stack in zip(results, tiny_encoder.extract(texts, layers=layers), strict=True):
                np.testing.assert_allclose(decode(item["hidden"]), stack.hidden, atol=1e-5)
        elif level == "word":
            for item, wv in zip(
                results, tiny_encoder.embed_words(texts, subword=mode, layers=layers), strict=True
            ):
                np.testing.assert_allclose(decode(item["word_vectors"]), wv.vectors, atol=1e-5)
        else:
            layer_spec = None if layers is None else layers
            want = tiny_encoder.embed(texts, pool=mode, fuse=fuse, layers=layer_spec)
            got = np.stack([decode(item["embedding"]) for item in results])
            np.testing.assert_allclose(got.reshape(want.shape), want, atol=1e-5)
    text = metrics.text
    assert 'layerwise_requests_total{endpoint="/v1/layers",status="200"} 32.0' in text
    runs = float(text.split("layerwise_batch_requests_count ")[1].split()[0])
    assert runs < 32  # requests were merged into shared model runs


def test_serve_cli_warns_on_public_address_and_sigterm_drains(tmp_path, make_tiny_model):
    from typer.testing import CliRunner

    from layerwise.cli import app
    from layerwise.cli._serve import _is_loopback

    assert _is_loopback("127.0.0.1") and _is_loopback("::1") and _is_loopback("localhost")
    assert not _is_loopback("0.0.0.0") and not _is_loopback("192.168.1.4")
    monkey = {k: v for k, v in os.environ.items() if k != "LAYERWISE_API_KEY"}
    result = CliRunner(env=monkey).invoke(
        app, ["serve", "--host", "0.0.0.0", "--model", str(tmp_path / "none")]
    )
    assert result.exit_code == 2 and "without an API key" in result.output  # warned, then failed to load

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = str(make_tiny_model("bert", 6))
    server = subprocess.Popen(
        [sys.executable, "-m", "layerwise.cli", "serve", "--model", model, "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=monkey,
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        texts = [f"sentence number {i} about the bank of the river " * 8 for i in range(1500)]
        outcome = {}

        def request():
            outcome["response"] = httpx.post(
                f"http://127.0.0.1:{port}/v1/embeddings", json={"input": texts}, timeout=120
            )

        thread = threading.Thread(target=request)
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive()  # the request is in flight (it takes about 3 s)
        children = [
            int(pid)
            for task in os.listdir(f"/proc/{server.pid}/task")
            for pid in Path(f"/proc/{server.pid}/task/{task}/children").read_text().split()
        ]
        spawned = [p for p in children if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(spawned) == 1  # the model process (a CPU server runs its models there)
        server.send_signal(signal.SIGTERM)
        thread.join(120)
        response = outcome["response"]
        assert response.status_code == 200 and len(response.json()["data"]) == len(texts)
        assert server.wait(30) in (0, 143)

        # and they are gone, not orphaned: the model process before the server exits; the
        # multiprocessing resource tracker as soon as its pipe from the server closes
        def running(pid: int) -> bool:
            stat = Path(f"/proc/{pid}/stat")
            try:
                return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                return False

        assert not running(spawned[0])  # closed and joined by the server's shutdown
        deadline = time.time() + 10
        while any(running(pid) for pid in children) and time.time() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in children if running(pid)]
    finally:
        if server.poll() is None:
            server.kill()


def test_a_pooling_layerwise_lacks_is_a_422_not_a_silent_mean(tmp_path, default_model_dir):
    import json
    import shutil

    folder = tmp_path / "weighted"
    shutil.copytree(default_model_dir, folder)
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    pooling.update(pooling_mode_mean_tokens=False, pooling_mode_weightedmean_tokens=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    encoder = lw.Encoder(folder, device="cpu")
    with pytest.raises(lw.OptionError, match="pools with 'weightedmean'"):
        encoder.encode(["a"])  # the library refuses: so must the service
    app = create_app({"weighted": encoder})

    async def scenario(client):
        return (
            await client.post("/v1/embeddings", json={"input": ["a bank"]}),
            await client.post("/v1/embeddings", json={"input": ["a bank"], "pool": "sentence:mean"}),
        )

    default, explicit = run_app(app, scenario)
    assert default.status_code == 422 and "pools with 'weightedmean'" in default.json()["error"]["message"]
    assert explicit.status_code == 200
    want = encoder.embed(["a bank"], layers=-1, pool="mean", normalize=True)  # the model's Normalize module
    np.testing.assert_allclose([explicit.json()["data"][0]["embedding"]], want, atol=1e-5)


@pytest.mark.parametrize("fast", [True, False])
def test_json_bodies_keep_every_float_and_write_nan_as_null(monkeypatch, fast):
    """orjson (serve extra) and the standard-library fallback write the same numbers; a NaN from a
    broken model is null (strict JSON has no NaN), as in layerwise's JSON Lines files."""
    import json

    from layerwise.serve import _responses as responses

    if not fast:
        monkeypatch.setattr(responses, "_orjson", None)
    vector = np.random.default_rng(0).standard_normal(384).astype(np.float32)
    body = {"data": [{"embedding": vector.tolist(), "index": 0}], "model": "m ü"}
    decoded = json.loads(responses.json_response(body).body)
    assert decoded["model"] == "m ü"
    assert np.array_equal(np.array(decoded["data"][0]["embedding"], dtype=np.float32), vector)  # exact
    broken = {"embedding": [1.5, float("nan"), float("inf")], "nested": {"x": [float("-inf")]}}
    assert json.loads(responses.json_response(broken).body) == {
        "embedding": [1.5, None, None],
        "nested": {"x": [None]},
    }


def test_the_model_worker_returns_freed_heap_memory_between_runs(tiny_encoder, monkeypatch):
    """glibc keeps freed heap mapped (RSS crept up under load): the server trims it at most every
    SERVE_TRIM_EVERY_S seconds of runs (layerwise._host.memory), and the results are unaffected."""
    from layerwise._host import memory
    from layerwise.serve import _batcher as batcher
    from layerwise.serve import _model_process as model_process

    real = memory._malloc_trim()
    if real is None:
        pytest.skip("not glibc: malloc_trim does not exist here")
    trims: list[int] = []
    monkeypatch.setattr(memory, "_malloc_trim", lambda: lambda pad: trims.append(pad) or real(pad))
    for module in (batcher, model_process):
        monkeypatch.setattr(module, "SERVE_TRIM_EVERY_S", 0.0)
    app = create_app({"tiny": tiny_encoder})

    async def scenario(client):
        return [await client.post("/v1/embeddings", json={"input": [f"text {i}"]}) for i in range(3)]

    responses = run_app(app, scenario)
    assert [r.status_code for r in responses] == [200, 200, 200]
    want = tiny_encoder.embed(["text 2"], layers=-1)[0]
    np.testing.assert_allclose(responses[2].json()["data"][0]["embedding"], want.reshape(-1), atol=1e-6)
    assert trims == [0, 0, 0]  # once per run: every run is 0 s after the last trim


@pytest.mark.parametrize("preset", [None, "ACTIVE"])
def test_serve_lets_idle_openmp_threads_sleep_unless_the_user_chose(monkeypatch, preset):
    """Before torch loads OpenMP, serve and explore ask for OMP_WAIT_POLICY=PASSIVE (a spinning
    OpenMP thread took the event loop's core); a policy the user set is kept."""
    import layerwise._encoder
    from layerwise.cli import _serve as cli_serve
    from layerwise.serve import _model_process as model_process

    monkeypatch.setattr(model_process, "_PASSIVE_SET_HERE", False)  # restored afterwards
    if preset is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", preset)

    class Loaded:
        model = None  # the transformers model, which the server builds at start

        def __init__(self, name, **options):
            self.name = name or "default"

        @classmethod
        def from_settings(cls, settings):
            options = settings.as_dict()
            return cls(options.pop("model"), **options)

    monkeypatch.setattr(layerwise._encoder, "Encoder", Loaded)
    encoders = cli_serve._load_encoders(["a", "b"], lw.Settings(device="cpu"))
    assert list(encoders) == ["a", "b"]
    assert os.environ["OMP_WAIT_POLICY"] == (preset or "PASSIVE")
    # the model process starts with OpenMP's default unless the user chose: there, passive threads
    # are woken for every parallel region (a one-text run on two threads: 18 ms instead of 7)
    with model_process._model_process_environment():
        assert os.environ.get("OMP_WAIT_POLICY") == preset
    assert os.environ["OMP_WAIT_POLICY"] == (preset or "PASSIVE")


def test_serve_runs_the_models_in_a_process_of_their_own_on_a_cpu(monkeypatch):
    """The server's own Encoders (tokenising, metadata, explorer) ask for one stream; the runs go to
    the model process on a CPU (--in-process keeps them here) with --concurrent-forwards passed through."""
    import layerwise._encoder
    from layerwise import cli
    from layerwise._model.loading.source import pick_device
    from layerwise.cli import _serve as cli_serve

    asked: list[int | None] = []

    class Loaded:
        model = None  # the transformers model, which the server builds at start

        def __init__(self, name, **options):
            self.name = name or "default"
            self.device = pick_device(options["device"])
            asked.append(options.get("concurrent_forwards"))

        @classmethod
        def from_settings(cls, settings):
            options = settings.as_dict()
            return cls(options.pop("model"), **options)

    monkeypatch.setattr(layerwise._encoder, "Encoder", Loaded)
    settings = []
    monkeypatch.setattr("layerwise.serve.create_app", lambda enc, s, **kw: settings.append(s))
    monkeypatch.setattr(cli_serve, "_run_server", lambda *args, **kwargs: None)
    from typer.testing import CliRunner

    for args in ([], ["--concurrent-forwards", "3"], ["--in-process", "--concurrent-forwards", "2"]):
        result = CliRunner().invoke(cli.app, ["serve", "--device", "cpu", *args])
        assert result.exit_code == 0, result.output
    assert asked == [1, 1, 1]
    assert [(s.model_process, s.concurrent_forwards) for s in settings] == [
        (True, None),
        (True, 3),
        (False, 2),
    ]


def test_serve_builds_the_transformers_model_at_start(monkeypatch, default_model_dir):
    """The explorer's attention maps need it; a request must not wait 1.5-2 s while it is built."""
    from layerwise.cli import _serve as cli_serve

    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # torch is loaded already; keep the env as it was
    encoders = cli_serve._load_encoders(
        [str(default_model_dir)], lw.Settings(device="cpu", concurrent_forwards=1)
    )
    (encoder,) = encoders.values()
    assert encoder.models.built and encoder.engine.packed.model is encoder.model


def test_the_forward_runs_the_plan_the_response_records(tiny_encoder):
    """A server with --long-texts window: /v1/embeddings and /v1/layers record windows and the
    server's stride in their plan, and their vectors are those of that plan run offline."""
    from layerwise.serve import ServeSettings, create_app

    app = create_app(
        {"tiny": tiny_encoder}, ServeSettings(long_texts="window", stride=40, model_process=False)
    )
    long_text = "the river bank " * 60  # over the tiny model's maximum: windows

    async def scenario(client):
        embeddings = await client.post("/v1/embeddings", json={"input": [long_text], "pool": "sentence:mean"})
        layers = await client.post("/v1/layers", json={"texts": [long_text], "pool": "sentence:mean"})
        return embeddings, layers

    embeddings, layers = run_app(app, scenario)
    assert embeddings.status_code == 200 and layers.status_code == 200, (embeddings.text, layers.text)
    meta = layers.json()
    assert (meta["long_texts"], meta["stride"]) == ("window", 40)
    want = tiny_encoder.embed([long_text], layers=-1, pool="mean", long_texts="window", stride=40)[0]
    np.testing.assert_allclose(embeddings.json()["data"][0]["embedding"], want, atol=1e-5)
