"""Schemathesis over every operation of /openapi.json, authenticated, against a real server: no 5xx,
every status documented, every response of its documented content type and schema. A bounded run
(LAYERWISE_FUZZ_EXAMPLES, default 20 examples per operation); benchmarks/fuzz_http.py runs the long one.
Also: /docs and /redoc render offline (their assets are this server's own files)."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")
httpx = pytest.importorskip("httpx")

from conftest import REPO, running_server  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from fuzz_http import AUTH, KEY, fuzz  # noqa: E402

from layerwise.serve import ServeSettings, create_app  # noqa: E402

EXAMPLES = int(os.environ.get("LAYERWISE_FUZZ_EXAMPLES", "20"))


@pytest.fixture(scope="module")
def served(make_tiny_model):
    import layerwise as lw

    encoder = lw.Encoder(make_tiny_model("bert"), device="cpu")
    app = create_app({"tiny": encoder}, ServeSettings(api_key=KEY, max_explore_tokens=512))
    with running_server(app) as url:
        yield url


def test_every_operation_answers_as_documented(served):
    failures, statuses = fuzz(served, EXAMPLES)
    assert not failures, "\n\n".join(f"{label}:\n{report}" for label, report in failures.items())
    assert len(statuses) == 14  # 13 operations, and /v1/layers as npz too
    assert all(status < 500 for counts in statuses.values() for status in counts)


def test_npz_answers_are_documented(served):
    response = httpx.post(
        f"{served}/v1/layers", json={"texts": ["a"]}, headers={**AUTH, "accept": "application/x-npz"}
    )
    spec = httpx.get(f"{served}/openapi.json").json()
    documented = spec["paths"]["/v1/layers"]["post"]["responses"]["200"]["content"]
    assert response.status_code == 200 and response.headers["content-type"] in documented


def test_the_api_pages_load_nothing_from_elsewhere(served):
    for page in ("/docs", "/redoc"):
        html = httpx.get(f"{served}{page}").text
        assert "cdn" not in html.lower() and "googleapis" not in html
        for asset in (
            "/docs-assets/swagger-ui-bundle.js",
            "/docs-assets/swagger-ui.css",
            "/docs-assets/redoc.standalone.js",
        ):
            if asset in html:
                assert httpx.get(f"{served}{asset}").status_code == 200


def test_the_schema_says_what_this_server_accepts(served):
    """The served models' names, their depth and the encoder-only final norm are in /openapi.json,
    and every pool and fuse spelling the schema lists is answered 200 (the schema is never wider
    than the server)."""
    schemas = httpx.get(f"{served}/openapi.json").json()["components"]["schemas"]
    layers, embeddings = schemas["LayersRequest"]["properties"], schemas["EmbeddingsRequest"]["properties"]
    assert {"type": "string", "enum": ["tiny"]} in embeddings["model"]["anyOf"]
    assert layers["final_norm"]["anyOf"] == [  # no decoder served: no "all"
        {"type": "boolean"}, {"type": "string", "enum": ["last", "none"]}, {"type": "null"},
    ]  # fmt: skip
    for spelled in ("last", "none", True, False):  # #55, 17: the CLI's spellings too
        answer = httpx.post(
            f"{served}/v1/embeddings", json={"input": "a b", "final_norm": spelled}, headers=AUTH
        )
        assert answer.status_code == 200, (spelled, answer.text)
    assert schemas["AttentionRequest"]["properties"]["layer"]["maximum"] == 3
    assert "sentence:mean" in layers["pool"]["enum"] and "word:first" in layers["pool"]["enum"]
    sentence_pools = embeddings["pool"]["anyOf"][0]["enum"]
    assert "mean" in sentence_pools and "word:first" not in sentence_pools
    for pool in layers["pool"]["enum"]:
        answer = httpx.post(f"{served}/v1/layers", json={"texts": ["a b"], "pool": pool}, headers=AUTH)
        assert answer.status_code == 200, (pool, answer.text)
    for pool in sentence_pools:
        answer = httpx.post(f"{served}/v1/embeddings", json={"input": "a b", "pool": pool}, headers=AUTH)
        assert answer.status_code == 200, (pool, answer.text)
    bare, levelled = (
        httpx.post(f"{served}/v1/embeddings", json={"input": "a b", "pool": p}, headers=AUTH).json()
        for p in ("max", "sentence:max")
    )
    assert bare["data"][0]["embedding"] == levelled["data"][0]["embedding"]
    for fuse in embeddings["fuse"]["anyOf"][0]["enum"]:
        answer = httpx.post(f"{served}/v1/embeddings", json={"input": "a b", "fuse": fuse}, headers=AUTH)
        assert answer.status_code == 200, (fuse, answer.text)
