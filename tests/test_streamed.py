"""Layer-streamed extraction (streaming=True): every hidden state equals the in-memory forward's, at
most two units' weights are ever resident, the block size follows the memory budget, and what
cannot be streamed is refused by name."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_same_stacks, needs_smollm2, smollm2_folder

import layerwise as lw
from layerwise.errors import ModelLoadError, OptionError

TEXTS = [
    "The bank raised rates.",
    "She sat on the river bank and watched the water for a long while.",
    "Layer by layer.",
    "A much longer sentence about nothing in particular, which goes on and on, so that it is cut.",
]
PAIRS = [("Where is the bank?", "By the river."), ("Who wrote it?", "Nobody knows who wrote it.")]


@pytest.fixture(scope="module")
def bert(make_tiny_model):
    model = make_tiny_model("bert", 3)
    return lw.Encoder(model, device="cpu"), lw.Encoder(
        model, device="cpu", streaming=True, stream_block_tokens=24
    )


def test_a_streamed_encoder_gives_every_layer_of_the_in_memory_forward(bert):
    memory, streamed = bert
    assert_same_stacks(streamed.extract(TEXTS, layers="all"), memory.extract(TEXTS, layers="all"))
    assert_same_stacks(streamed.extract(pairs=PAIRS, layers="all"), memory.extract(pairs=PAIRS, layers="all"))
    windowed = {"layers": "all", "long_texts": "window", "stride": 4}
    assert_same_stacks(streamed.extract(TEXTS, **windowed), memory.extract(TEXTS, **windowed))
    np.testing.assert_allclose(
        streamed.embed(TEXTS, layers="all"), memory.embed(TEXTS, layers="all"), atol=1e-5
    )
    words = [streamed.embed_words(TEXTS, layers="all"), memory.embed_words(TEXTS, layers="all")]
    for a, b in zip(*words, strict=True):
        assert a.words == b.words
        np.testing.assert_allclose(a.vectors, b.vectors, atol=1e-5)
    fused = {"layers": "all", "fuse": "mean_all"}
    np.testing.assert_allclose(streamed.embed(TEXTS, **fused), memory.embed(TEXTS, **fused), atol=1e-5)
    assert streamed.engine.streamed.model.peak_resident <= 2  # the running unit and the one read ahead
    hashes = [enc.run_meta(lw.OutputPlan())["weights_sha256"] for enc in (streamed, memory)]
    assert hashes[0] == hashes[1]  # a store resumes across the two


def test_a_streamed_encoder_reads_each_layer_once_per_block_and_holds_two_at_most(bert, monkeypatch):
    """Counted on the tensors themselves: whenever a unit's weights are read, the skeleton holds real
    (not meta) weights of at most one other unit."""
    _, streamed = bert
    forward = streamed.engine.streamed.model
    reads: list[int] = []
    original = forward.checkpoint.read

    def counted(names, dtype, device):
        held = sum(any(not p.is_meta for m in unit for p in m.parameters()) for unit in forward.units)
        reads.append(held + 1)
        return original(names, dtype, device)

    many = TEXTS * 10  # batches of 4 texts, blocks of 24 tokens or more: several blocks
    n_tokens = sum(len(s.tokens) for s in streamed.extract(many, layers=0, batch_size=4))
    monkeypatch.setattr(forward.checkpoint, "read", counted)
    streamed.extract(many, layers="all", batch_size=4)
    blocks = len(reads) // 4  # each block reads the embeddings and the 3 layers, once
    assert len(reads) == 4 * blocks and 1 < blocks <= -(-n_tokens // 24)
    assert max(reads) <= 2


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma", "gemma2", "gemma3_text", "gpt2"])
@pytest.mark.parametrize("final_norm", [True, False, "all"])
def test_a_streamed_decoder_gives_every_layer_of_the_in_memory_forward(decoder_folder, arch, final_norm):
    folder = decoder_folder(arch)
    memory = lw.Encoder(folder, device="cpu", final_norm=final_norm)
    streamed = lw.Encoder(folder, device="cpu", final_norm=final_norm, streaming=True, stream_block_tokens=40)
    assert_same_stacks(streamed.extract(TEXTS, layers="all"), memory.extract(TEXTS, layers="all"))
    pooled = {"layers": "all", "pool": "last" if arch == "qwen3" else "mean"}  # reduced layer by layer
    np.testing.assert_allclose(streamed.embed(TEXTS, **pooled), memory.embed(TEXTS, **pooled), atol=1e-5)
    assert streamed.engine.streamed.model.peak_resident <= 2
    hashes = [enc.run_meta(lw.OutputPlan())["weights_sha256"] for enc in (streamed, memory)]
    assert hashes[0] == hashes[1]


def test_the_command_line_streams_with_the_same_numbers(make_tiny_model, tmp_path):
    from typer.testing import CliRunner

    from layerwise.cli import app

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    model = make_tiny_model("bert", 3)
    runs = {}
    for name, extra in (("memory", []), ("streamed", ["--streaming", "--stream-block-tokens", "16"])):
        out = tmp_path / f"{name}.npz"
        run = CliRunner().invoke(app, ["extract", str(texts), "-o", str(out), "--model", str(model), *extra])
        assert run.exit_code == 0, run.output
        runs[name] = out
    assert lw.read_meta(runs["streamed"])["streaming"] is True
    assert lw.read_meta(runs["streamed"])["stream_block_tokens"] == 16
    with np.load(runs["memory"]) as a, np.load(runs["streamed"]) as b:
        keys = [k for k in a.files if k.startswith("hidden")]
        assert keys and all(np.allclose(a[k], b[k], atol=1e-5) for k in keys)


def test_the_block_follows_the_memory_budget_and_a_budget_under_one_layer_is_refused(make_tiny_model):
    model = make_tiny_model("bert", 3)
    enc = lw.Encoder(model, device="cpu", streaming=True, max_device_memory="64MB")
    assert enc.engine.settings.stream_block_tokens > 1000
    meta = enc.run_meta(lw.OutputPlan())
    assert (meta["streaming"], meta["max_device_memory"]) == (True, "64MB")
    assert meta["stream_block_tokens"] == enc.engine.settings.stream_block_tokens
    # 300 KB hold one batch's work at a time, not two: the batches of a layer then run one by one
    tight = lw.Encoder(model, device="cpu", streaming=True, max_device_memory="300KB", concurrent_forwards=2)
    assert tight.engine.pool is None and tight.engine.settings.concurrent_forwards == 1
    assert 128 <= tight.engine.streamed.plan.block_tokens < 1000  # at least one text of 128 tokens
    with pytest.raises(OptionError, match=r"max_device_memory='10KB'.*layer.*bytes"):
        lw.Encoder(model, device="cpu", streaming=True, max_device_memory="10KB")
    with pytest.raises(OptionError, match=r"max_device_memory='lots'"):
        lw.Settings(max_device_memory="lots")


def _unstreamable(make_tiny_model, folder: Path) -> Path:
    """A BERT whose activation (gelu_10) the light model, and so the streamed encoder, does not run."""
    shutil.copytree(make_tiny_model("bert", 2), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu_10"}))
    return folder


def test_what_needs_the_whole_model_is_refused_when_streaming(bert, make_tiny_model, tmp_path):
    _, streamed = bert
    with pytest.raises(OptionError, match="streaming"):
        streamed.extract(TEXTS, method="hooks")
    with pytest.raises(OptionError, match="streaming"):
        streamed.model  # noqa: B018
    with pytest.raises(OptionError, match="packed"):
        lw.Settings(streaming=True, packed=False)
    with pytest.raises(
        ModelLoadError, match=r"with activation 'gelu_10'.*does not stream yet.*gpt2.*streaming=False"
    ):
        lw.Encoder(_unstreamable(make_tiny_model, tmp_path / "m"), device="cpu", streaming=True)


def test_a_store_written_in_memory_is_resumed_by_a_streamed_run(bert, tmp_path):
    """The weights' hash and every setting the resume check compares are the same: a streamed
    rerun of an in-memory store is accepted, and what it holds is what the streamed run computes."""
    memory, streamed = bert
    path = tmp_path / "texts.lw"
    lw.extract_to_store(memory, TEXTS[:2], path, progress=False)
    lw.extract_to_store(streamed, TEXTS[:2], path, progress=False)  # nothing to do, nothing refused
    store = lw.open_store(path)
    for i, stack in enumerate(streamed.extract(TEXTS[:2], layers="all")):
        np.testing.assert_allclose(store[i].hidden, stack.hidden.astype(np.float16), atol=2e-3)


@needs_smollm2
def test_a_gguf_file_streams_one_dequantised_layer_at_a_time_with_the_in_memory_numbers(smollm2):
    """SmolLM2's Q4_1 GGUF file: each layer de-quantised when it is read (by gguf, laid out by
    transformers' own processor: Llama's permuted query and key rows put back), the word table by
    row; every hidden state and the weights' hash as ``from_pretrained(gguf_file=...)`` gives them."""
    streamed = lw.Encoder(smollm2_folder(), device="cpu", streaming=True, stream_block_tokens=64)
    for final_norm in (True, "all"):
        got = streamed.extract(TEXTS, layers="all", final_norm=final_norm)
        want = smollm2.extract(TEXTS, layers="all", final_norm=final_norm)
        for a, b in zip(got, want, strict=True):
            # the streamed layers run F.linear; in memory on a non-Intel x86 the prepacked oneDNN
            # linears: float32 rounding apart, at the scale of each state (SmolLM2's reach 2e4)
            assert a.tokens == b.tokens
            scale = np.abs(b.hidden).reshape(len(b.hidden), -1).max(axis=1)[:, None, None]
            assert (np.abs(a.hidden - b.hidden) <= 1e-5 + 5e-5 * scale).all()
    assert streamed.engine.streamed.model.peak_resident <= 2
    hashes = [enc.run_meta(lw.OutputPlan())["weights_sha256"] for enc in (streamed, smollm2)]
    assert hashes[0] == hashes[1]


def test_a_model_whose_weights_do_not_fit_streams_by_itself(make_tiny_model, tmp_path, monkeypatch, caplog):
    """streaming=None (the default): loaded whole when the weights fit in the free memory, streamed
    when they do not (said in a warning); streaming=False loads it whole anyway, and a model that
    cannot be streamed is loaded whole with a warning that says why."""
    from layerwise._model.streaming import fits

    model = make_tiny_model("bert", 3)
    memory = lw.Encoder(model, device="cpu")
    assert memory.settings.streaming is None and not memory.streamed and memory.engine.streamed is None
    parameters = sum(p.numel() for p in memory.model.parameters())
    assert fits.weights_bytes(memory.source, torch.float32) == 4 * parameters  # from the headers alone
    assert fits.weights_bytes(memory.source, torch.bfloat16) == 2 * parameters
    monkeypatch.setattr(fits, "free_bytes", lambda device: 4 * parameters)  # 80% of it is too little
    with caplog.at_level(logging.WARNING, logger="layerwise"):
        auto = lw.Encoder(model, device="cpu")
    assert auto.settings.streaming is None and auto.streamed and auto.engine.streamed is not None
    assert "do not fit in the" in caplog.text and "streaming it layer by layer" in caplog.text
    assert_same_stacks(auto.extract(TEXTS, layers="all"), memory.extract(TEXTS, layers="all"))
    assert auto.run_meta(lw.OutputPlan())["streaming"] is True
    assert lw.Encoder(model, device="cpu", streaming=False).engine.streamed is None
    caplog.clear()
    monkeypatch.setattr(fits, "free_bytes", lambda device: 1)
    with caplog.at_level(logging.WARNING, logger="layerwise"):
        whole = lw.Encoder(_unstreamable(make_tiny_model, tmp_path / "m"), device="cpu")
    assert whole.engine.streamed is None and "cannot be streamed" in caplog.text
