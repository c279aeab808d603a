"""The README's tour on a state-space model (a tiny random Mamba of transformers' own class, with a
tokenizer trained here): texts extracted to a store, the layers ranked without labels, a probe per
layer, and the explorer's grid of the same text, each equal to the Encoder's own numbers."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_app, ud_sentences
from typer.testing import CliRunner

import layerwise as lw
from layerwise.cli import app

pytestmark = pytest.mark.slow


def test_mamba_extract_store_layers_probe_explorer(tmp_path):
    import torch
    from any_models import save_with_norms_moved
    from sweep_models import small_config, tokenizer_for
    from transformers import MambaForCausalLM

    tokenizer = tokenizer_for("causal")
    config = small_config("mamba", tokenizer)
    config.num_hidden_layers = 4  # the probe's default fusions read the last four layers
    torch.manual_seed(0)
    model = save_with_norms_moved(MambaForCausalLM(config), tokenizer, tmp_path / "mamba")
    texts = [t for t in ud_sentences("dev", 60) if '"' not in t][:24]  # a quote opens a TSV field
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    runner = CliRunner()
    store = tmp_path / "texts.lw"
    result = runner.invoke(
        app, ["extract", str(tmp_path / "texts.txt"), "-m", str(model), "-o", str(store), "-q"]
    )
    assert result.exit_code == 0, result.output
    enc = lw.Encoder(model, device="cpu")
    want = enc.extract(texts[0])
    assert lw.open_store(store)[0].tokens == want.tokens
    np.testing.assert_allclose(lw.open_store(store)[0].hidden.astype(np.float32), want.hidden, atol=2e-2)

    result = runner.invoke(app, ["layers", str(tmp_path / "texts.txt"), "-m", str(model), "-q"])
    assert result.exit_code == 0, result.output

    rows = ["sentence\tlabel", *(f"{t}\t{'ab'[len(t.split()) % 2]}" for t in texts)]
    (tmp_path / "train.tsv").write_text("\n".join(rows[:17]) + "\n", encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("\n".join([rows[0], *rows[17:]]) + "\n", encoding="utf-8")
    result = runner.invoke(
        app,
        ["probe", "tsv", "--train", str(tmp_path / "train.tsv"), "--dev", str(tmp_path / "dev.tsv"),
         "-m", str(model), "--json", str(tmp_path / "probe.json")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output

    pytest.importorskip("httpx")
    from layerwise.explore import token_statistics
    from layerwise.serve import create_app

    app_ = create_app({"mamba": enc})

    async def ask(c):
        return await c.post("/v1/explore/tokens", json={"model": "mamba", "text": texts[0]})

    response = run_app(app_, ask)
    assert response.status_code == 200, response.text
    norms = np.array(response.json()["statistics"]["norm"], dtype=np.float64)
    expected = token_statistics(enc.extract(texts[0], long_texts="window"))["norm"]
    np.testing.assert_allclose(norms, expected, rtol=1e-4)
