"""Every path that can emit float16 refuses a value past its range (65,504) instead of writing inf.

The loud model is the tiny random BERT with its last layer's output LayerNorm weight multiplied by
1e5: its last hidden state (3) passes 65,504, the others stay small. Each path is walked twice: the
loud layer must be refused with an error naming float16's range and the fix (float32), and the quiet
layers must pass, so that the refusal is about the values and not the dtype.
"""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
from conftest import run_app
from typer.testing import CliRunner

import layerwise as lw
from layerwise.errors import OptionError

PAST = r"past float16's largest value \(65,504\).*float32"
TEXTS = ["The cat sat on the mat.", "Stocks fell sharply on Monday.", "A third, longer sentence here."]


@pytest.fixture(scope="module")
def loud_folder(tmp_path_factory, make_tiny_model):
    from transformers import AutoModel

    source = make_tiny_model("bert")
    folder = tmp_path_factory.mktemp("loud") / "loud-bert"
    model = AutoModel.from_pretrained(source)
    model.encoder.layer[-1].output.LayerNorm.weight.data *= 1e5
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def loud(loud_folder):
    enc = lw.Encoder(loud_folder, device="cpu")
    last = enc.extract(TEXTS, layers=-1)
    assert all(np.abs(s.hidden).max() > 65504 for s in last)  # the model is as loud as meant
    quiet = enc.extract(TEXTS, layers=[0, 1, 2])
    assert all(np.abs(s.hidden).max() < 1000 for s in quiet)
    return enc


@pytest.mark.parametrize("long_texts", ["truncate", "window"])
def test_extract_refuses_float16_overflow_on_the_packed_and_the_per_input_path(loud, long_texts):
    options = {"long_texts": long_texts, "stride": 4} if long_texts == "window" else {}
    if long_texts == "window":
        loud = lw.Encoder.from_settings(loud.settings.replace(max_length=8))
    with pytest.raises(OptionError, match=r"hidden state 3 of input \d .*" + PAST):
        loud.extract(TEXTS, layers="all", dtype="float16", **options)
    quiet = loud.extract(TEXTS, layers=[0, 2], dtype="float16", **options)
    exact = loud.extract(TEXTS, layers=[0, 2], **options)
    for a, b in zip(quiet, exact, strict=True):
        assert a.hidden.dtype == np.float16
        np.testing.assert_allclose(a.hidden.astype(np.float32), b.hidden, rtol=1e-3, atol=1e-3)


def test_embed_and_words_refuse_it(loud):
    with pytest.raises(OptionError, match=r"hidden state 3 of input \d .*" + PAST):
        loud.embed(TEXTS, layers="all", dtype="float16")
    with pytest.raises(OptionError, match=PAST):
        loud.embed_words(TEXTS, layers=-1, dtype="float16")
    assert np.isfinite(loud.embed(TEXTS, layers=[0, 1], dtype="float16")).all()


@pytest.mark.parametrize("suffix", [".npz", ".parquet", ".jsonl"])
def test_file_writers_and_export_refuse_it_and_leave_nothing(loud, tmp_path, suffix):
    out = tmp_path / f"v{suffix}"
    plan = lw.OutputPlan.parse(pool="sentence:mean", layers="all", dtype="float16")
    with pytest.raises(OptionError, match=r"hidden state 3 of input \d .*" + PAST):
        lw.extract_to_file(loud, TEXTS, out, plan, progress=False)
    assert not out.exists()
    store = tmp_path / "f32.lw"
    lw.extract_to_store(loud, TEXTS, store, lw.OutputPlan.parse(dtype="float32"), progress=False)
    with pytest.raises(OptionError, match=r"hidden state 3 of input \d .*" + PAST):
        lw.export_store(store, out, lw.OutputPlan.parse(pool="sentence:mean", layers=-1, dtype="float16"))
    assert not out.exists()
    summary = lw.export_store(
        store, out, lw.OutputPlan.parse(pool="sentence:mean", layers=0, dtype="float16")
    )
    assert summary["n_texts"] == len(TEXTS)


def test_store_cache_and_store_reads_refuse_it(loud, tmp_path):
    """Refused before their first commit, the store and the cache leave nothing of theirs behind:
    the folder when the run made it, the entries when the folder was there."""
    with pytest.raises(OptionError, match=r"hidden state 3 of input \d .*" + PAST):
        lw.extract_to_store(loud, TEXTS, tmp_path / "s.lw", progress=False)
    with pytest.raises(OptionError, match=r"blocks\.2\.hook_resid_post of context \d+ holds [\d,]+, " + PAST):
        lw.cache_activations(
            loud,
            TEXTS * 20,
            tmp_path / "cache",
            lw.CacheOptions(layers=[3], context=8, tokens=64),
            progress=False,
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    (tmp_path / "given.lw").mkdir()  # a folder the user made: left as it was, empty
    with pytest.raises(OptionError, match=PAST):
        lw.extract_to_store(loud, TEXTS, tmp_path / "given.lw", progress=False)
    assert list((tmp_path / "given.lw").iterdir()) == []
    (tmp_path / "given-cache").mkdir()
    with pytest.raises(OptionError, match=PAST):
        options = lw.CacheOptions(layers=[3], context=8, tokens=64)
        lw.cache_activations(loud, TEXTS * 20, tmp_path / "given-cache", options, progress=False)
    assert list((tmp_path / "given-cache").iterdir()) == []
    lw.extract_to_store(
        loud, TEXTS, tmp_path / "f32.lw", lw.OutputPlan.parse(dtype="float32"), progress=False
    )
    view = lw.open_store(tmp_path / "f32.lw").array(-1)
    with pytest.raises(OptionError, match=PAST):
        np.asarray(view, dtype=np.float16)
    assert np.asarray(lw.open_store(tmp_path / "f32.lw").array(0), dtype=np.float16).dtype == np.float16


def test_cli_extract_and_export_exit_2_with_the_message(loud_folder, tmp_path):
    from layerwise.cli import app

    texts = tmp_path / "small.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    runner = CliRunner()
    common = ["--model", str(loud_folder), "--device", "cpu", "--quiet"]
    out = tmp_path / "e.parquet"
    result = runner.invoke(
        app, ["extract", str(texts), "-o", str(out), "--pool", "sentence:mean", "--dtype", "float16", *common]
    )
    assert result.exit_code == 2, result.output
    assert "past float16's largest value" in result.output and not out.exists()
    store = tmp_path / "b32.lw"
    result = runner.invoke(app, ["extract", str(texts), "-o", str(store), "--dtype", "float32", *common])
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        app, ["export", str(store), "-o", str(out), "--dtype", "float16", "--layers", "-1", "--quiet"]
    )
    assert result.exit_code == 2, result.output
    assert "past float16's largest value" in result.output and not out.exists()


@pytest.mark.parametrize("pool", ["token", "sentence:mean", "word:first"])
@pytest.mark.parametrize("accept", ["application/json", "application/x-npz"])
def test_http_layers_answers_422_not_inf(loud, pool, accept):
    from layerwise.serve import create_app

    app = create_app({"loud": loud})

    body = {"texts": TEXTS, "layers": "all", "pool": pool, "dtype": "float16"}

    async def post_both(client):
        return [
            await client.post("/v1/layers", json=b, headers={"accept": accept})
            for b in (body, {**body, "layers": [0, 1]})
        ]

    refused, response = run_app(app, post_both)
    assert refused.status_code == 422, refused.text
    assert "past float16's largest value" in refused.json()["error"]["message"]
    assert response.status_code == 200
    if accept == "application/json":
        assert "inf" not in json.dumps(response.json()).lower()
    else:
        with np.load(io.BytesIO(response.content)) as npz:
            assert all(np.isfinite(npz[k]).all() for k in npz.files if npz[k].dtype == np.float16)


def test_ray_embed_actor_casts_through_the_check(loud):
    from layerwise.ray import EmbedActor

    actor = EmbedActor.__new__(EmbedActor)  # the actor's body, without starting Ray
    actor.encoder, actor.column, actor.output_column = loud, "text", "embedding"
    actor.plan = loud.settle(lw.OutputPlan.parse(pool="sentence:mean", layers="all", dtype="float16"))
    with pytest.raises(OptionError, match=PAST):
        actor({"text": np.array(TEXTS, dtype=object)})
    actor.plan = loud.settle(lw.OutputPlan.parse(pool="sentence:mean", layers=[0, 1], dtype="float16"))
    out = actor({"text": np.array(TEXTS, dtype=object)})["embedding"]
    assert out.dtype == np.float16 and np.isfinite(out).all()
