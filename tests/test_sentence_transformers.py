"""sentence-transformers users get sentence-transformers' vectors: same truncation, pooling and
normalisation, checked against sentence-transformers itself on short and long texts."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ud_sentences

import layerwise as lw


@pytest.fixture(scope="module")
def st_model(default_model_dir):
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(default_model_dir), device="cpu")


def test_encode_equals_sentence_transformers(default_encoder, st_model):
    short = ud_sentences("dev", 20)
    long = [" ".join(ud_sentences("dev", 120)[i : i + 40]) for i in (0, 40, 80)]  # ~600+ tokens each
    texts = [*short, *long, ""]
    assert max(len(t) for t in default_encoder.tokenize(long)) == 256  # truncated where ST truncates
    ours = default_encoder.encode(texts)
    theirs = st_model.encode(texts, convert_to_numpy=True, normalize_embeddings=False)
    assert ours.shape == theirs.shape == (len(texts), 384)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(default_encoder.encode("one text"), st_model.encode("one text"), atol=1e-5)


def test_max_length_override_and_normalize_option(default_encoder):
    enc = lw.Encoder(device="cpu", max_length=512)
    long_text = " ".join(ud_sentences("dev", 60))
    assert len(enc.tokenize([long_text])[0]) == 512
    raw = enc.embed([long_text], layers=-1)
    unit = enc.embed([long_text], layers=-1, normalize=True)
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-6)
    per_layer = default_encoder.embed(["a b"], normalize=True)  # every layer's vector has norm 1
    np.testing.assert_allclose(np.linalg.norm(per_layer, axis=-1), 1.0, atol=1e-6)
    with pytest.raises(lw.OptionError, match="normalize=True applies to sentence vectors"):
        lw.OutputPlan.parse(pool="word:first", normalize=True)


def test_store_and_cli_normalize(tmp_path, default_encoder):
    from typer.testing import CliRunner

    from layerwise.cli import app

    texts = ["The bank raised rates.", "We sat on the river bank."]
    lw.extract_to_store(
        default_encoder,
        texts,
        tmp_path / "s.lw",
        lw.OutputPlan.parse(layers=-1, pool="sentence:mean", normalize=True, dtype="float32"),
    )
    store = lw.open_store(tmp_path / "s.lw")
    assert store.meta["normalize"] is True
    np.testing.assert_allclose(np.stack([store[0][0], store[1][0]]), default_encoder.encode(texts), atol=1e-6)
    source = tmp_path / "t.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "e.npz"
    args = [
        "extract",
        str(source),
        "-o",
        str(out),
        "--pool",
        "sentence:mean",
        "--layers",
        "-1",
        "--normalize",
        "-q",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    np.testing.assert_allclose(np.load(out)["embeddings"][:, 0], default_encoder.encode(texts), atol=1e-6)
