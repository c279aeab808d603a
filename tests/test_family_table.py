"""A family is one row (src/layerwise/_model/families/table.py): adding a packed family whose blocks
transformers implements is a row, and everything that runs it reads the row. Here StarCoder2, which
the table runs on the general path, gets a row of its own in a copy of the table: it then runs
packed in memory and streamed, with its taps, equal to transformers' own forward."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ud_sentences

import layerwise as lw
from layerwise._model.families import table


@pytest.fixture
def starcoder2_packed(monkeypatch):
    """The table with one more packed family: StarCoder2's blocks (``layers``), final norm
    (``norm``), rotary positions and the pre-norm taps, in a copy of the table."""
    row = table.Family("decoder", "blocks", "layers", "norm", table.PRE_NORM_TAPS, "rotary", "StarCoder2")
    monkeypatch.setattr(table, "FAMILIES", {**table.FAMILIES, "starcoder2": row})
    return row


def test_a_new_row_runs_packed_and_streamed_with_transformers_numbers(starcoder2_packed, family_folder):
    folder = family_folder("starcoder2")
    texts = [*ud_sentences(limit=10), " ".join(ud_sentences(limit=8))]
    general = lw.Encoder(folder, device="cpu", packed=False)
    packed = lw.Encoder(folder, device="cpu")
    streamed = lw.Encoder(folder, device="cpu", streaming=True, stream_block_tokens=64)
    assert (general.run_path, packed.run_path, streamed.run_path) == ("general", "packed", "streamed")
    taps = ("attn_out", "mlp_out")
    want = general.extract(texts, layers="all", taps=taps)
    for got in (packed.extract(texts, layers="all", taps=taps), streamed.extract(texts, layers="all")):
        for ours, theirs in zip(got, want, strict=True):
            np.testing.assert_allclose(ours.hidden, theirs.hidden, atol=1e-5, rtol=0)
            for tap in ours.taps or {}:
                np.testing.assert_allclose(ours.taps[tap], theirs.taps[tap], atol=1e-5, rtol=0)
    assert packed.extract(texts[0], layers="all", taps=taps).taps.keys() == set(taps)


def test_the_row_is_what_info_says(starcoder2_packed, family_folder):
    from layerwise._model.what_runs import describe

    config = lw.Encoder(family_folder("starcoder2"), device="cpu").engine.models.config
    said = describe(config)
    assert (said["forward"], said["streaming"], said["positions"]) == ("packed", "yes", "rotary")


def test_without_the_row_it_runs_on_the_general_path(family_folder):
    assert lw.Encoder(family_folder("starcoder2"), device="cpu").run_path == "general"


def test_the_docs_table_is_the_family_table():
    """Every row of the table is in docs/models.md's rendered table (the figures test holds the
    rendering itself), each family named once."""
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "models.md").read_text(encoding="utf-8")
    rows = table.docs_rows()
    named = [name.strip("` ") for row in rows[:-1] for name in row[0].split("(")[0].split(",")]
    assert sorted(named) == sorted(table.FAMILIES)
    for row in rows:
        assert "| " + " | ".join(row) + " |" in page
