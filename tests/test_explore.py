"""The layer explorer's numbers (layerwise.explore) and its endpoints, against independent code."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from conftest import run_app, ud_sentences  # noqa: E402

import layerwise as lw  # noqa: E402
from layerwise.errors import InputError, OptionError  # noqa: E402
from layerwise.explore import (  # noqa: E402
    MaskedLMHead,
    ReferenceSet,
    logit_lens,
    sample_sentences,
    token_statistics,
    word_projection,
)
from layerwise.serve import ServeSettings, create_app  # noqa: E402

KEY = "explore-key-0123456789"


@pytest.fixture(scope="module")
def reference(tiny_encoder):
    return ReferenceSet("ud dev", tiny_encoder.name, tiny_encoder.extract(ud_sentences("dev", 60)))


# ---------------------------------------------------------------------------------------------- library
def test_token_statistics_equal_a_plain_loop(tiny_encoder):
    stack = tiny_encoder.extract(["The bank raised rates."], text_pairs=["Rates rose."])[0]
    got = token_statistics(stack)
    h = stack.hidden.astype(np.float64)
    for k in range(stack.n_held):
        for t in range(stack.n_tokens):
            v, last = h[k, t], h[-1, t]
            assert got["norm"][k, t] == pytest.approx(np.sqrt(v @ v), rel=1e-12)
            assert got["cos_last"][k, t] == pytest.approx(
                v @ last / np.sqrt((v @ v) * (last @ last)), abs=1e-12
            )
            if k == 0:
                assert np.isnan(got["cos_prev"][k, t]) and np.isnan(got["drift"][k, t])
            else:
                prev = h[k - 1, t]
                assert got["cos_prev"][k, t] == pytest.approx(
                    v @ prev / np.sqrt((v @ v) * (prev @ prev)), abs=1e-12
                )
                assert got["drift"][k, t] == pytest.approx(np.linalg.norm(v - prev), rel=1e-12)
    np.testing.assert_allclose(got["cos_last"][-1], 1.0, atol=1e-12)


def test_neighbours_equal_brute_force_cosine_search(reference, tiny_encoder):
    from sklearn.neighbors import NearestNeighbors

    stack = tiny_encoder.extract("She sat on the river bank.")
    query = stack.tokens.index("bank")
    found = reference.neighbours(stack.hidden[:, query], k=4)
    assert len(found) == len(reference.layers) == stack.n_held
    rows = [
        (s, t) for s, st in enumerate(reference.stacks) for t in range(st.n_tokens) if st.word_ids[t] >= 0
    ]
    for k, layer_found in enumerate(found):
        matrix = np.stack([reference.stacks[s].hidden[k, t] for s, t in rows])
        index = NearestNeighbors(n_neighbors=4, metric="cosine", algorithm="brute").fit(matrix)
        distance, nearest = index.kneighbors(stack.hidden[k, query][None])
        assert [(n.sentence, n.token) for n in layer_found] == [rows[i] for i in nearest[0]]
        np.testing.assert_allclose([n.cosine for n in layer_found], 1 - distance[0], atol=1e-5)
        for n in layer_found:  # the span marks the token in its sentence
            assert n.text == reference.stacks[n.sentence].text
            piece = n.text[n.start : n.end].lower()
            assert piece == n.token_text.removeprefix("##").lower()
    with pytest.raises(InputError, match="one vector per reference layer"):
        reference.neighbours(stack.hidden[:2, query])


def test_similarity_equals_pairwise_linear_cka(reference):
    """Linear CKA written out (Kornblith et al. 2019): columns centred, ||Y'X||^2 / (||X'X|| ||Y'Y||)
    over every token row of the reference (fewer than its 4,000-row sample: all of them)."""
    rows = [np.concatenate([s.hidden[k] for s in reference.stacks]).astype(np.float64) for k in range(4)]
    assert len(rows[0]) < 4000
    centred = [x - x.mean(axis=0) for x in rows]

    def cka(x, y):
        return np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))

    got = reference.similarity
    for i in range(4):
        for j in range(4):
            assert got[i, j] == pytest.approx(cka(centred[i], centred[j]), abs=1e-10)


def test_word_projection_is_the_pca_of_each_occurrence(reference):
    """Written out: each site's vector is the mean of the wordpieces inside its span, and each
    layer's points are the first two principal components (numpy's SVD of the centred points,
    up to each component's sign)."""
    got = word_projection(reference.stacks, ["the", "a", "nonexistentword"])
    assert got["missing"] == ["nonexistentword"] and set(got["labels"]) == {"the", "a"}
    vectors = []
    for (s, segment, start, end), label in zip(got["sites"], got["labels"], strict=True):
        stack = reference.stacks[s]
        assert segment == 0 and stack.text[start:end].lower() == label
        inside = (stack.offsets[:, 0] >= start) & (stack.offsets[:, 1] <= end) & (stack.offsets[:, 1] > 0)
        vectors.append(stack.hidden[:, inside].astype(np.float64).mean(axis=1))
    points = np.stack(vectors, axis=1)  # (layers, sites, dim)
    assert len(got["layers"]) == len(points)
    for k, layer_points in enumerate(points):
        centred = layer_points - layer_points.mean(axis=0)
        components = np.linalg.svd(centred, full_matrices=False)[2][:2]
        expected = centred @ components.T
        ours = np.asarray(got["points"][k])
        signs = np.sign(np.sum(ours * expected, axis=0))
        np.testing.assert_allclose(ours * signs, expected, rtol=1e-5, atol=2e-5)  # float32 points
    with pytest.raises(InputError, match="3 or more"):
        word_projection(reference.stacks, ["nonexistentword"])


def test_builtin_sample_is_ud_ewt_with_its_licence():
    from layerwise.explore import sample_license

    sentences = sample_sentences()
    assert len(sentences) == 400 and len({s for s, _ in sentences}) == 400
    assert all(
        s.startswith(("answers-", "email-", "newsgroup-", "reviews-", "weblog-")) for s, _ in sentences
    )
    assert sum(" bank " in f" {t.lower()} " for _, t in sentences) >= 5
    assert "Attribution-ShareAlike 4.0" in sample_license()


@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert"])
def test_logit_lens_last_layer_equals_the_masked_lm_forward(make_tiny_mlm, arch):
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    folder = make_tiny_mlm(arch)
    enc = lw.Encoder(folder, device="cpu")
    head = MaskedLMHead.load(enc)
    assert head is not None
    text = "The [MASK] raised its [MASK]."
    got = logit_lens(enc, text, k=3, head=head)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForMaskedLM.from_pretrained(folder).eval()
    inputs = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits[0].numpy()
    positions = [i for i, t in enumerate(inputs["input_ids"][0].tolist()) if t == tokenizer.mask_token_id]
    assert [m["position"] for m in got["masks"]] == positions and len(positions) == 2
    assert got["layers"] == list(range(enc.n_hidden_states))
    for mask in got["masks"]:
        row = logits[mask["position"]]
        probs = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
        top = np.argsort(-probs)[:3]
        last = mask["predictions"][-1]
        assert [t for t, _ in last] == tokenizer.convert_ids_to_tokens(top.tolist())
        np.testing.assert_allclose([p for _, p in last], probs[top], atol=1e-6)
    with pytest.raises(InputError, match=r"put \[MASK\]"):
        logit_lens(enc, "no mask here", head=head)


def test_no_lens_without_a_saved_head(default_encoder, tiny_encoder):
    assert MaskedLMHead.load(default_encoder) is None  # a sentence-transformers checkpoint
    assert MaskedLMHead.load(tiny_encoder) is None  # a BertModel checkpoint: the head would be random
    with pytest.raises(InputError, match="no masked-LM head"):
        logit_lens(tiny_encoder, "The [MASK] rose.")


def test_reference_set_from_a_token_store(tiny_encoder, tmp_path):
    texts = ud_sentences("dev", 30)
    lw.extract_to_store(
        tiny_encoder, texts, tmp_path / "c.lw", lw.OutputPlan.parse(layers="all", dtype="float32")
    )
    ref = ReferenceSet.from_store(tmp_path / "c.lw", max_tokens=200)
    exact = tiny_encoder.extract(texts)
    assert ref.model == tiny_encoder.name and 200 <= sum(s.n_tokens for s in ref.stacks) < 200 + 80
    for got, want in zip(ref.stacks, exact, strict=False):
        assert got.tokens == want.tokens
        np.testing.assert_allclose(got.hidden, want.hidden, atol=1e-6)
    lw.extract_to_store(
        tiny_encoder, texts, tmp_path / "s.lw", lw.OutputPlan.parse(dtype="float16", pool="sentence:mean")
    )
    with pytest.raises(OptionError, match="token vectors"):
        ReferenceSet.from_store(tmp_path / "s.lw")


# ---------------------------------------------------------------------------------------------- endpoints
def test_endpoints_return_the_library_numbers(tiny_encoder, make_tiny_mlm):
    mlm = lw.Encoder(make_tiny_mlm("bert"), device="cpu", max_length=16)
    app = create_app({"tiny": tiny_encoder, "mlm": mlm})
    long_text = " ".join(ud_sentences("dev", 3))  # over mlm's 16 tokens: windows

    async def scenario(client):
        page = await client.get("/")
        assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
        assert "layer explorer" in page.text
        assert (await client.get("/explore/explorer.js")).status_code == 200
        info = (await client.post("/v1/explore/tokens", json={"model": "mlm", "text": long_text})).json()
        lens_info = (await client.get("/v1/explore/info")).json()
        neighbours = await client.post(
            "/v1/explore/neighbours", json={"model": "tiny", "text": "a bank", "token": 2}
        )
        attention = await client.post(
            "/v1/explore/attention", json={"model": "tiny", "text": "a bank", "layer": 2}
        )
        lens = await client.post("/v1/explore/lens", json={"model": "mlm", "text": "a [MASK] rose", "k": 2})
        no_lens = await client.post("/v1/explore/lens", json={"model": "tiny", "text": "a [MASK] rose"})
        projection = await client.post(
            "/v1/explore/projection", json={"model": "tiny", "words": ["the", "a"]}
        )
        cka = await client.get("/v1/explore/similarity", params={"model": "tiny"})
        bad = [
            await client.post("/v1/explore/neighbours", json={"model": "tiny", "text": "a", "token": 9}),
            await client.post("/v1/explore/attention", json={"model": "tiny", "text": "a", "layer": 4}),
            await client.post("/v1/explore/tokens", json={"model": "tiny", "text": ""}),
            await client.post("/v1/explore/tokens", json={"model": "tiny", "text": "a", "extra": 1}),
            await client.post("/v1/explore/tokens", json={"model": "nope", "text": "a"}),
            await client.post("/v1/explore/projection", json={"model": "tiny", "words": ["zzqq"]}),
        ]
        return info, lens_info, neighbours, attention, lens, no_lens, projection, cka, bad

    info, lens_info, neighbours, attention, lens, no_lens, projection, cka, bad = run_app(app, scenario)
    stack = mlm.extract(long_text, long_texts="window")
    assert info["tokens"] == list(stack.tokens) and info["n_windows"] == stack.n_windows > 1
    for name, values in token_statistics(stack).items():
        got = np.array([[np.nan if v is None else v for v in row] for row in info["statistics"][name]])
        np.testing.assert_allclose(got, values, atol=1e-9)
    assert {m["id"]: m["lens"] for m in lens_info["models"]} == {"tiny": False, "mlm": True}
    assert "pca" in lens_info["projections"]

    sample = ReferenceSet.sample(tiny_encoder)
    query = tiny_encoder.extract("a bank")
    want = sample.neighbours(query.hidden[:, 2], k=5)
    got = neighbours.json()
    assert got["token_text"] == "bank" and got["layers"] == [0, 1, 2, 3]
    for row, want_row in zip(got["neighbours"], want, strict=True):
        assert [(n["text"], n["start"], n["cosine"]) for n in row] == [
            (n.text, n.start, n.cosine) for n in want_row
        ]

    body = attention.json()
    maps = np.frombuffer(base64.b64decode(body["attention"]["data"]), "<f4").reshape(
        body["attention"]["shape"]
    )
    taps = tiny_encoder.extract("a bank", taps=["attention_probs"]).taps["attention_probs"]
    np.testing.assert_allclose(maps, taps[1], atol=1e-7)
    np.testing.assert_allclose(maps.sum(axis=-1), 1.0, atol=1e-5)

    head = MaskedLMHead.load(mlm)
    want_lens = logit_lens(mlm, "a [MASK] rose", k=2, head=head)
    assert lens.status_code == 200
    assert [[list(p) for p in layer] for layer in want_lens["masks"][0]["predictions"]] == lens.json()[
        "masks"
    ][0]["predictions"]
    assert no_lens.status_code == 422 and "no masked-LM head" in no_lens.json()["error"]["message"]

    proj = projection.json()
    want_proj = word_projection(sample.stacks, ["the", "a"])
    np.testing.assert_allclose(proj["points"], want_proj["points"], atol=1e-4)
    np.testing.assert_allclose(cka.json()["cka"], sample.similarity, atol=1e-6)

    assert [r.status_code for r in bad] == [422, 422, 422, 422, 404, 422]
    assert "past the text's 3 tokens" in bad[0].json()["error"]["message"]
    assert "layers 1 … 3" in bad[1].json()["error"]["message"]
    assert "text" in bad[2].json()["error"]["message"]
    assert "unknown field 'extra'" in bad[3].json()["error"]["message"]
    assert "3 or more" in bad[5].json()["error"]["message"]


def test_explorer_endpoints_need_the_key_and_the_page_does_not(tiny_encoder):
    app = create_app({"tiny": tiny_encoder}, ServeSettings(api_key=KEY))

    async def scenario(client):
        auth = {"Authorization": f"Bearer {KEY}"}
        return (
            (await client.get("/")).status_code,
            (await client.get("/v1/explore/info")).status_code,
            (await client.post("/v1/explore/tokens", json={"text": "a"})).status_code,
            (await client.get("/v1/explore/info", headers=auth)).status_code,
        )

    assert run_app(app, scenario) == (200, 401, 401, 200)


def test_explore_command_prints_the_url_and_serves_the_page(make_tiny_model, tmp_path):
    folder = make_tiny_model("bert")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("DISPLAY", None)
    env.pop("WAYLAND_DISPLAY", None)
    command = ["explore", "The bank <b>", "--model", str(folder), "--port", "0", "--device", "cpu"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "layerwise.cli", *command], stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        url = None
        deadline = time.time() + 90
        while url is None and time.time() < deadline:
            line = proc.stderr.readline()
            if "layer explorer: " in line:
                url = line.split("layer explorer: ", 1)[1].split()[0]
        assert url is not None and url.startswith("http://127.0.0.1:")
        assert "text=The+bank+%3Cb%3E" in url
        base = url.split("/?")[0]
        for _ in range(100):
            try:
                page = httpx.get(base + "/", timeout=5)
                break
            except httpx.ConnectError:
                time.sleep(0.1)
        assert page.status_code == 200
        assert httpx.get(base + "/v1/explore/info", timeout=5).json()["models"][0]["id"] == str(folder)
    finally:
        proc.terminate()
        proc.wait(20)


def test_explore_store_of_another_model_is_refused(tiny_encoder, tmp_path):
    from typer.testing import CliRunner

    from layerwise.cli import app

    lw.extract_to_store(
        tiny_encoder, ud_sentences("dev", 5), tmp_path / "c.lw", lw.OutputPlan.parse(layers="all")
    )
    result = CliRunner().invoke(
        app, ["explore", "--store", str(tmp_path / "c.lw"), "--no-open", "--device", "cpu"]
    )
    assert result.exit_code != 0
    assert "which is not served here" in result.output and "--model" in result.output


def test_token_views_show_tokens_as_read(decoder_encoder):
    """#55, 9: /v1/explore/tokens, /attention and /neighbours showed byte-level pieces ('Ġcapital');
    the lens and `layerwise show` decode them. The pieces stay beside them."""
    from conftest import asgi_posts

    gpt2 = decoder_encoder("gpt2")
    app = create_app({"gpt2": gpt2})
    text = "The capital of France is Paris."
    grid, attention, neighbours = (
        r.json()
        for r in asgi_posts(app, [
            ("/v1/explore/tokens", {"text": text}),
            ("/v1/explore/attention", {"text": text, "layer": 1}),
            ("/v1/explore/neighbours", {"text": text, "token": 1}),
        ])
    )  # fmt: skip
    pieces = list(gpt2.extract(text).tokens)
    assert any(p.startswith("Ġ") for p in pieces)
    for answer in (grid, attention):
        assert answer["pieces"] == pieces
        assert "".join(answer["tokens"]) == text and not any("Ġ" in t for t in answer["tokens"])
    assert neighbours["token_piece"] == pieces[1] and neighbours["token_text"] == pieces[1].replace("Ġ", " ")
    assert all("Ġ" not in n["token"] for row in neighbours["neighbours"] for n in row)
