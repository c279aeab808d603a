"""Settings travel whole: one frozen value builds every Encoder; the final norm is a setting of each
call, command and request; every output says how it was made (lw.read_meta, layerwise info)."""

from __future__ import annotations

import base64
import json
import pickle

import numpy as np
import pytest
from conftest import asgi_posts, needs_smollm2, smollm2_folder
from test_option_coverage import fake_ray  # noqa: F401  (the in-process stand-in for Ray Data)
from typer.testing import CliRunner

import layerwise as lw
from layerwise.cli import app
from layerwise.errors import OptionError

TEXTS = ["The bank raised rates.", "She sat on the river bank after the flood.", "ok"]


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


# ------------------------------------------------------------------------------------------ Settings
def test_settings_are_checked_and_round_trip():
    settings = lw.Settings(
        "some/model", model_dtype="bfloat16", max_length=64, final_norm="all", concurrent_forwards=1
    )
    assert lw.Settings.from_dict(settings.as_dict()) == settings
    assert pickle.loads(pickle.dumps(settings)) == settings  # what Ray and the model process carry
    assert settings.replace(batch_size=8).batch_size == 8 and settings.batch_size is None
    for bad, message in [
        ({"model_dtype": "int8"}, "model_dtype='int8' is not valid"),
        ({"batch_size": 0}, "batch_size=0 must be a whole number >= 1"),
        ({"final_norm": 1}, "final_norm=1 is not valid"),
        ({"final_norm": "last"}, "final_norm='last' is not valid"),
        ({"method": "grad"}, "method='grad' is not valid"),
        ({"packed": "yes"}, "packed='yes' must be True or False"),
    ]:
        with pytest.raises(OptionError, match=message):
            lw.Settings(**bad)
    with pytest.raises(OptionError, match=r"unknown settings \['colour'\]"):
        lw.Settings.from_dict({"colour": "red"})


def test_an_encoder_is_made_from_settings_and_reports_them(make_tiny_model):
    folder = str(make_tiny_model("bert"))
    settings = lw.Settings(folder, device="cpu", max_length=12, batch_size=4, max_tokens=40, packed=False)
    enc = lw.Encoder.from_settings(settings)
    assert enc.settings == settings  # every field, none dropped
    assert (enc.max_length, enc.batch_size, enc.max_tokens, enc.engine.packed) == (12, 4, 40, None)
    again = lw.Encoder.from_settings(enc.settings)  # what a Ray actor or the model process does
    np.testing.assert_array_equal(again.embed(TEXTS), enc.embed(TEXTS))
    default = lw.Encoder(device="cpu")
    assert default.settings.model == lw.DEFAULT_MODEL  # the packaged model, by its name


# ------------------------------------------------------------------------------------ the final norm
def _norm(encoder, hidden: np.ndarray) -> np.ndarray:
    """The decoder's own final norm module applied to raw hidden states (the independent path)."""
    import torch

    from layerwise._model.final_norm import final_norm_module

    with torch.inference_mode():
        return final_norm_module(encoder.model)(torch.from_numpy(hidden)).numpy()


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_final_norm_per_call_equals_the_encoders_setting(decoder_encoder, decoder_folder, arch):
    enc = decoder_encoder(arch)  # final_norm=True by default
    raw = enc.extract(TEXTS, final_norm=False)
    last = enc.n_layers
    for mode in (True, False, "all"):
        per_call = enc.extract(TEXTS, final_norm=mode)
        made_so = lw.Encoder(decoder_folder(arch), device="cpu", final_norm=mode).extract(TEXTS)
        for a, b, r in zip(per_call, made_so, raw, strict=True):
            np.testing.assert_allclose(a.hidden, b.hidden, atol=1e-5)
            expected = r.hidden.copy()
            if mode == "all":
                expected = _norm(enc, expected)
            elif mode is True:
                expected[last] = _norm(enc, expected[last])
            np.testing.assert_allclose(a.hidden, expected, atol=1e-5)
    # embed, embed_words and features take it too
    np.testing.assert_allclose(
        enc.embed(TEXTS, layers="all", pool="mean", final_norm="all"),
        np.stack([_norm(enc, r.hidden).mean(axis=1) for r in raw]),
        atol=1e-5,
    )
    words = enc.embed_words(TEXTS, layers=-1, final_norm=False)
    assert words[0].vectors.shape[-1] == enc.hidden_size
    features = enc.features(TEXTS, pools=["mean"], fuses=["last"], final_norm="all")
    np.testing.assert_allclose(
        features[("mean", "last")],
        np.stack([_norm(enc, r.hidden[last]).mean(axis=0) for r in raw]),
        atol=1e-5,
    )


def test_the_packed_and_padded_forwards_norm_alike(decoder_folder):
    packed = lw.Encoder(decoder_folder("llama"), device="cpu")
    padded = lw.Encoder(decoder_folder("llama"), device="cpu", packed=False)
    for mode in (True, "all"):
        for method in ("hidden_states", "hooks"):
            a = packed.extract(TEXTS, final_norm=mode)
            b = padded.extract(TEXTS, final_norm=mode, method=method)
            for x, y in zip(a, b, strict=True):
                np.testing.assert_allclose(x.hidden, y.hidden, atol=1e-5)


def test_an_encoder_refuses_a_final_norm(tiny_encoder, tmp_path):
    with pytest.raises(OptionError, match="final_norm='all' passes every hidden state through the model's"):
        tiny_encoder.extract(TEXTS, final_norm="all")
    with pytest.raises(OptionError, match=r"\(a 'bert' model\) has none .*: leave final_norm out"):
        lw.Encoder(tiny_encoder.source, final_norm="all")
    # True and False say the same of an encoder's states: both taken, here and at construction
    expected = tiny_encoder.embed(TEXTS)
    for value in (True, False):
        np.testing.assert_array_equal(tiny_encoder.embed(TEXTS, final_norm=value), expected)
        built = lw.Encoder(tiny_encoder.source, final_norm=value)
        np.testing.assert_array_equal(built.embed(TEXTS), expected)
    result = cli("extract", _txt(tmp_path), "-o", tmp_path / "x.npz", "--model", tiny_encoder.source,
                 "--final-norm", "all")  # fmt: skip
    assert result.exit_code == 2 and "final_norm='all'" in result.output and not (tmp_path / "x.npz").exists()


def _txt(folder):
    path = folder / "t.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


def test_a_store_refuses_to_resume_with_another_final_norm(decoder_encoder, tmp_path):
    enc = decoder_encoder("llama")
    path = tmp_path / "d.lw"
    lw.extract_to_store(enc, TEXTS[:2], path, lw.OutputPlan(final_norm="all", dtype="float32"))
    with pytest.raises(lw.StoreError, match="final_norm: stored 'all', now True"):
        lw.extract_to_store(enc, TEXTS, path, lw.OutputPlan(dtype="float32"))
    assert lw.read_meta(path)["final_norm"] == "all"
    np.testing.assert_allclose(
        lw.open_store(path)[1].hidden, enc.extract(TEXTS[1], final_norm="all").hidden, atol=1e-5
    )


# ----------------------------------------------------------------------- every output says how it was made
@pytest.mark.parametrize("suffix", [".npz", ".jsonl", ".parquet", ".lw"])
def test_read_meta_says_how_every_output_was_made(tmp_path, make_tiny_model, suffix):
    folder = make_tiny_model("bert")
    out = tmp_path / f"out{suffix}"
    pool = "sentence:mean" if suffix == ".parquet" else "token"
    result = cli("extract", _txt(tmp_path), "-o", out, "--model", folder, "--max-length", 9,
                 "--batch-size", 2, "--model-dtype", "bfloat16", "--layers", "0,-1", "--pool", pool,
                 "--long-texts", "window", "--stride", 3, "--method", "hooks")  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = lw.read_meta(out)
    expected = {
        "model": str(folder), "model_dtype": "bfloat16", "max_length": 9, "batch_size": 2, "method": "hooks",
        "layers": [0, 3], "pool": pool, "long_texts": "window", "stride": 3, "final_norm": None,
        "layerwise_version": lw.__version__,
    }  # fmt: skip
    assert {k: meta.get(k) for k in expected} == expected
    assert meta["corpus"]["encoding_errors"] == "strict" and len(meta["weights_sha256"]) == 64
    shown = cli("info", out)
    assert shown.exit_code == 0 and "bfloat16" in shown.output and "model_dtype" in shown.output
    assert json.loads(cli("info", out, "--json").output)["max_length"] == 9


def test_read_meta_refuses_what_layerwise_did_not_write(tmp_path):
    (tmp_path / "x.csv").write_text("a\n")
    with pytest.raises(lw.InputError, match="is not a layerwise output"):
        lw.read_meta(tmp_path / "x.csv")
    (tmp_path / "plain").mkdir()
    with pytest.raises(lw.InputError, match="not a layerwise store"):
        lw.read_meta(tmp_path / "plain")
    result = cli("info", tmp_path / "missing.npz")
    assert result.exit_code == 2 and "does not exist" in result.output


def test_no_text_leaves_the_texts_out_of_an_npz(tmp_path, tiny_encoder):
    """#46, 1: --no-text was ignored for .npz."""
    out, kept = tmp_path / "nt.npz", tmp_path / "t.npz"
    for path, flags in ((out, ["--no-text"]), (kept, [])):
        result = cli("extract", _txt(tmp_path), "-o", path, "--model", tiny_encoder.source, *flags)
        assert result.exit_code == 0, result.output
    with np.load(out) as npz, np.load(kept) as full:
        assert "texts_utf8" not in npz.files and "texts_utf8" in full.files
        assert lw.read_npz_texts(npz) == [] and lw.read_npz_texts(full) == TEXTS
        np.testing.assert_array_equal(npz["hidden_1"], full["hidden_1"])
    assert lw.read_meta(out)["keep_text"] is False


# ------------------------------------------------------------------------------------- CLI and Ray
@needs_smollm2
def test_final_norm_from_the_command_line_on_smollm2(tmp_path, smollm2):
    gguf = next(smollm2_folder().glob("*.gguf"))
    out = tmp_path / "x.npz"
    result = cli(
        "extract", _txt(tmp_path), "-o", out, "--model", gguf, "--final-norm", "all", "--layers", "0,15,30"
    )
    assert result.exit_code == 0, result.output
    expected = smollm2.extract(TEXTS, layers=[0, 15, 30], final_norm="all")
    with np.load(out) as npz:
        for i, stack in enumerate(expected):
            np.testing.assert_allclose(npz[f"hidden_{i}"], stack.hidden, atol=1e-5)
    assert lw.read_meta(out)["final_norm"] == "all"


def test_ray_gets_every_setting(tmp_path, make_tiny_model, fake_ray):  # noqa: F811
    """--ray with --model-dtype bfloat16 --max-length 8: the store says so, and its vectors equal
    the single-process run with the same options (the settings reach the actors whole)."""
    folder = make_tiny_model("bert")
    texts = tmp_path / "t.txt"
    texts.write_text("\n".join(f"{t} number {i}" for i, t in enumerate(TEXTS * 4)) + "\n")
    common = ["--model", folder, "--model-dtype", "bfloat16", "--max-length", 8, "--dtype", "float32"]
    on_ray = cli("extract", texts, "-o", tmp_path / "r.lw", "--ray", "local", "--workers", 2, *common)
    alone = cli("extract", texts, "-o", tmp_path / "s.lw", *common)
    assert on_ray.exit_code == 0 and alone.exit_code == 0, on_ray.output + alone.output
    meta = lw.read_meta(tmp_path / "r.lw")
    assert (meta["kind"], meta["model_dtype"], meta["max_length"], meta["n_shards"]) == (
        "sharded store",
        "bfloat16",
        8,
        2,
    )
    sharded, single = lw.open_store(tmp_path / "r.lw"), lw.open_store(tmp_path / "s.lw")
    assert len(sharded) == len(single) == 12
    for i in range(12):
        np.testing.assert_array_equal(sharded[i].hidden, single[i].hidden)  # both bfloat16 forwards
        assert sharded[i].n_tokens <= 8


# ------------------------------------------------------------------------------------------- HTTP
def _decode(array: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(array["data"]), dtype=array["dtype"]).reshape(array["shape"])


def test_final_norm_in_requests(decoder_encoder, tiny_encoder):
    pytest.importorskip("fastapi")
    from layerwise.serve import ServeSettings, create_app

    enc = decoder_encoder("llama")
    app = create_app({"dec": enc, "enc": tiny_encoder}, ServeSettings(model_process=False))
    response, embedded, bad, refused = asgi_posts(
        app,
        [
            ("/v1/layers", {"model": "dec", "texts": TEXTS, "final_norm": "all"}),
            (
                "/v1/embeddings",
                {"model": "dec", "input": TEXTS, "pool": "sentence:last", "final_norm": False},
            ),
            ("/v1/layers", {"model": "dec", "texts": TEXTS, "final_norm": "some"}),
            ("/v1/embeddings", {"model": "enc", "input": TEXTS, "final_norm": "all"}),
        ],
    )
    assert response.status_code == 200, response.text
    assert response.json()["final_norm"] == "all"
    expected = enc.extract(TEXTS, final_norm="all")
    for item, stack in zip(response.json()["results"], expected, strict=True):
        np.testing.assert_allclose(_decode(item["hidden"]), stack.hidden, atol=1e-5)
    assert embedded.status_code == 200, embedded.text
    np.testing.assert_allclose(
        np.asarray([d["embedding"] for d in embedded.json()["data"]]),
        enc.embed(TEXTS, layers=-1, pool="last", final_norm=False),
        atol=1e-5,
    )
    assert bad.status_code == 422 and "final_norm" in bad.text
    assert refused.status_code == 422
    assert refused.json()["error"]["param"] == "final_norm" and "leave final_norm out" in refused.text
    schema = app.openapi()["components"]["schemas"]
    assert "final_norm" in schema["LayersRequest"]["properties"]
    assert "final_norm" in schema["EmbeddingsRequest"]["properties"]


# ------------------------------------------------------------------------------------------ .jsonl
def test_jsonl_ignores_other_fields_and_names_near_misses(tmp_path, tiny_encoder):
    good = tmp_path / "hub.jsonl"
    good.write_text(
        "".join(json.dumps({"text": t, "label": i, "id": f"x{i}"}) + "\n" for i, t in enumerate(TEXTS))
    )
    result = cli("extract", good, "-o", tmp_path / "g.npz", "--model", tiny_encoder.source)
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "g.npz") as npz:
        assert lw.read_npz_texts(npz) == TEXTS
    near = tmp_path / "near.jsonl"
    near.write_text(json.dumps({"text": "a", "text_pairs": "b"}) + "\n")
    result = cli("extract", near, "-o", tmp_path / "n.npz", "--model", tiny_encoder.source)
    assert result.exit_code == 2 and "'text_pairs', not 'text_pair'" in result.output
    cased = tmp_path / "cased.jsonl"
    cased.write_text(json.dumps({"Text": "a"}) + "\n")
    result = cli("extract", cased, "-o", tmp_path / "c.npz", "--model", tiny_encoder.source)
    assert result.exit_code == 2 and "rename it to 'text'" in result.output


def test_a_new_setting_that_changes_the_numbers_is_checked_on_resume_with_no_list_to_edit(
    tiny_encoder, tmp_path, monkeypatch
):
    """Settings grows a field marked NUMBERS (a RoPE scale, say): the store's resume check takes it
    from the field's metadata, and a run recorded with another value is refused, naming it."""
    import dataclasses

    import layerwise._settings.settings
    from layerwise._settings.settings import NUMBERS, Settings
    from layerwise.store._resume import resume_keys

    @dataclasses.dataclass(frozen=True)
    class Grown(Settings):
        rope_scale: float = dataclasses.field(default=1.0, metadata=NUMBERS)
        log_every: int = 10  # does not change the numbers: not checked

    assert "rope_scale" not in resume_keys()
    monkeypatch.setattr(layerwise._settings.settings, "Settings", Grown)
    assert "rope_scale" in resume_keys() and "log_every" not in resume_keys()
    path = tmp_path / "s.lw"
    texts = ["the river bank", "a loan from the bank"]
    real = type(tiny_encoder).run_meta
    monkeypatch.setattr(
        type(tiny_encoder), "run_meta", lambda self, plan: {**real(self, plan), "rope_scale": 1.0}
    )
    lw.extract_to_store(tiny_encoder, texts, path, progress=False)
    lw.extract_to_store(tiny_encoder, texts, path, progress=False)  # the same value: resumes (nothing to do)
    monkeypatch.setattr(
        type(tiny_encoder), "run_meta", lambda self, plan: {**real(self, plan), "rope_scale": 2.0}
    )
    with pytest.raises(lw.StoreError, match=r"rope_scale: stored 1\.0, now 2\.0"):
        lw.extract_to_store(tiny_encoder, texts, path, progress=False)


def test_the_encoder_is_made_from_one_settings_value(make_tiny_model):
    """Encoder(settings) is the constructor; Encoder(model, **options) builds the same Settings, and
    an unknown keyword names the known ones. The Encoder keeps the Settings whole (no field copied
    onto it), and the engine receives them resolved for the model and the device."""
    import dataclasses

    model = make_tiny_model("bert", 2)
    settings = lw.Settings(str(model), device="cpu", batch_size=3, max_tokens=77, concurrent_forwards=1)
    enc = lw.Encoder(settings)
    assert enc.settings == settings.replace(model=enc.name)
    same = lw.Encoder(str(model), device="cpu", batch_size=3, max_tokens=77, concurrent_forwards=1)
    assert same.settings == enc.settings
    assert lw.Encoder(settings, batch_size=5).settings.batch_size == 5  # keywords replace fields
    # only filled in: the length, and whether it streams (None: the weights fit, so no)
    assert enc.engine.settings == enc.settings.replace(max_length=enc.max_length, streaming=False)
    assert (enc.batch_size, enc.max_tokens, enc.engine.settings.device) == (3, 77, "cpu")
    names = {f.name for f in dataclasses.fields(lw.Settings)}
    assert not names & set(vars(enc)), "the Encoder copies a field of its Settings"
    default = lw.Encoder(lw.Settings(str(model), device="cpu"))
    assert (default.settings.batch_size, default.engine.settings.batch_size) == (None, 128)
    assert default.engine.settings.max_tokens == 2048
    with pytest.raises(OptionError, match=r"unknown options \['batchsize'\].*batch_size"):
        lw.Encoder(str(model), batchsize=3)


def test_the_encoder_docstring_names_every_setting():
    """The Encoder's docstring lists the Settings fields it takes as options: all of them (a new
    field fails here until it is named there)."""
    import dataclasses
    import re

    listed = re.search(r"which documents each \(([^)]*)\)", " ".join(lw.Encoder.__doc__.split()))
    assert listed is not None, "the Encoder docstring's list of settings moved"
    names = [n.strip() for n in listed.group(1).split(",")]
    assert names == [f.name for f in dataclasses.fields(lw.Settings)][1:]  # model: its first argument


def test_the_pool_lists_are_derived_from_the_one_list():
    from typing import get_args

    from layerwise._analysis.layer_choice import USES, Use
    from layerwise._features.device_pool import GROUP_POOLS, SENTENCE_AS_GROUP
    from layerwise._features.names import SENTENCE_POOLS, SUBWORD_POOLS

    assert GROUP_POOLS is SUBWORD_POOLS and get_args(Use) == USES
    assert list(SENTENCE_AS_GROUP) == list(SENTENCE_POOLS) and set(SENTENCE_AS_GROUP.values()) <= set(
        GROUP_POOLS
    )
    assert SENTENCE_AS_GROUP["cls"] == "first"  # [CLS] is a sentence's first token
