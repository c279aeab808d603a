"""The numbers a streamed model's block plan is made of, each against an independent count: binary
and decimal size units, two units' weights against the layers' real parameter bytes, the bytes a
block keeps per token for each rotary kind (Gemma 3 has two), the share of free memory past which a
model streams by default, and every unit released when a block fails midway."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import layerwise as lw
from layerwise._model.streaming import fits
from layerwise._settings.placement import parse_bytes


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1KiB", 2**10),
        ("3MiB", 3 * 2**20),
        ("2GiB", 2 * 2**30),
        ("1TiB", 2**40),
        ("1GB", 10**9),
        ("512MB", 512 * 10**6),
    ],
)
def test_sizes_read_binary_and_decimal_units(text, size):
    assert parse_bytes(text, "max_device_memory") == size
    assert parse_bytes(text.lower(), "max_device_memory") == size


def _bytes(module: torch.nn.Module, skip: tuple[torch.nn.Parameter, ...] = ()) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters() if all(p is not s for s in skip))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_weights_a_block_holds_are_two_units_of_the_real_model(decoder_folder, arch):
    """Two units (the running one and the one read ahead): twice the largest of the embeddings
    (without the word table, read by row; GPT-2's positions with them) and each layer, counted on
    the transformers model's own parameters."""
    folder = decoder_folder(arch)
    model = lw.Encoder(folder, device="cpu").model
    layers = model.h if arch == "gpt2" else model.layers
    words = model.get_input_embeddings().weight
    embeddings = _bytes(model.wpe) if arch == "gpt2" else 0
    largest = max(embeddings, *(_bytes(layer, (words,)) for layer in layers))
    shape = lw.Encoder(folder, device="cpu", streaming=True).models.streamed.shape()
    assert shape.weights == 2 * largest
    config = model.config
    assert shape.state == 4 * config.hidden_size and shape.vocab == config.vocab_size


@pytest.fixture(scope="module")
def gemma3_both_kinds(tmp_path_factory):
    """A tiny Gemma 3 whose layers use both attention kinds (local and global), each with its own
    rotary embedding (the default pattern, five local to one global, gives three layers one kind)."""
    from decoder_models import decoder_config, sentencepiece_tokenizer
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("gemma3-both")
    tokenizer = sentencepiece_tokenizer()
    config = decoder_config("gemma3_text", tokenizer, 3)
    config.layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_each_rotary_kind_is_kept_per_token_gemma3_two(decoder_folder, gemma3_both_kinds):
    """A block waiting in host memory keeps on the device, per token, its ids, positions and text
    groups (three int64) and each rotary kind's cos and sin: a Gemma 3 with local and global layers
    two, Llama one, GPT-2 none. The streamed Gemma 3 gives the in-memory numbers, each layer with
    its own kind's rotary embedding."""
    held = {}
    folders = {
        "gemma3_text": gemma3_both_kinds,
        "llama": decoder_folder("llama"),
        "gpt2": decoder_folder("gpt2"),
    }
    for arch, folder in folders.items():
        enc = lw.Encoder(folder, device="cpu", streaming=True)
        head = (
            getattr(enc.config, "head_dim", None) or enc.config.hidden_size // enc.config.num_attention_heads
        )
        held[arch] = (enc.models.streamed.shape().held - 24) / (2 * head * 4)
    assert held == {"gemma3_text": 2, "llama": 1, "gpt2": 0}
    texts = ["The bank raised rates.", "She sat on the river bank and watched the water for a long while."]
    memory = lw.Encoder(gemma3_both_kinds, device="cpu", final_norm="all")
    streamed = lw.Encoder(gemma3_both_kinds, device="cpu", final_norm="all", streaming=True)
    for a, b in zip(streamed.extract(texts), memory.extract(texts), strict=True):
        np.testing.assert_allclose(a.hidden, b.hidden, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("share", "streams"), [(0.9, True), (0.7, False)])
def test_a_model_streams_by_default_past_80_percent_of_the_free_memory(
    make_tiny_model, monkeypatch, share, streams
):
    model = make_tiny_model("bert", 3)
    needed = fits.weights_bytes(str(model), torch.float32)
    assert needed
    monkeypatch.setattr(fits, "free_bytes", lambda device: int(needed / share))
    assert lw.Encoder(model, device="cpu").streamed is streams


def test_a_block_that_fails_midway_releases_every_unit(make_tiny_model, monkeypatch):
    """A layer that raises in the middle of a block: the error reaches the caller, the running unit
    and the one read ahead are both released (none resident), and the next call runs."""
    enc = lw.Encoder(make_tiny_model("bert", 4), device="cpu", streaming=True, stream_block_tokens=16)
    model = enc.engine.streamed.model
    real = model.layer_step
    calls = []

    def failing(depth: int):
        step = real(depth)

        def run(hidden, batch, carried):
            calls.append(depth)
            if depth == 2:
                raise RuntimeError("a layer failed")
            return step(hidden, batch, carried)

        return run

    monkeypatch.setattr(model, "layer_step", failing)
    with pytest.raises(RuntimeError, match="a layer failed"):
        enc.embed(["The bank raised rates."], layers="all")
    assert 2 in calls and model.resident == 0
    monkeypatch.undo()
    assert enc.embed(["The bank raised rates."], layers="all").shape == (1, 5, enc.hidden_size)
    assert model.resident == 0 and model.peak_resident <= 2


def test_a_memory_cap_the_weights_exceed_streams_the_model_or_is_refused(make_tiny_model, tmp_path):
    """streaming left out with a max_device_memory the weights do not fit: the model streams (the
    cap is honoured, not ignored by loading it whole); a model that cannot stream is refused,
    naming the sizes and the fix. A cap the weights fit loads the model whole."""
    import json
    import shutil

    from layerwise.errors import ModelLoadError

    model = make_tiny_model("bert", 3)
    needed = fits.weights_bytes(str(model), torch.float32)
    assert needed
    capped = lw.Encoder(model, device="cpu", max_device_memory=str(needed))  # 80 % of it: too little
    assert capped.streamed and capped.run_meta(lw.OutputPlan())["streaming"] is True
    assert not lw.Encoder(model, device="cpu", max_device_memory=str(2 * needed)).streamed
    folder = tmp_path / "gelu_10"
    shutil.copytree(model, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu_10"}))
    with pytest.raises(
        ModelLoadError, match=r"do not fit in max_device_memory=.* cannot be streamed .* Raise"
    ):
        lw.Encoder(folder, device="cpu", max_device_memory=str(needed))


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        (
            {"streaming": False, "max_device_memory": "64MB"},
            r"max_device_memory='64MB' .* loaded whole: leave it out",
        ),
        (
            {"streaming": False, "stream_block_tokens": 64},
            r"stream_block_tokens=64 .* streaming=False nothing streams",
        ),
        (
            {"device_map": "auto", "stream_block_tokens": 64},
            r"stream_block_tokens=64 .* device_map='auto' nothing",
        ),
        (
            {"packed": False, "stream_block_tokens": 64},
            r"stream_block_tokens=64 .* packed=False nothing streams",
        ),
        (
            {"streaming": True, "max_device_memory": "300KB", "stream_block_tokens": 100_000_000},
            r"stream_block_tokens=100,000,000 does not fit max_device_memory='300KB': .* holds a block of",
        ),
    ],
)
def test_an_option_the_run_would_not_read_is_refused(make_tiny_model, options, refusal):
    from layerwise.errors import OptionError

    with pytest.raises(OptionError, match=refusal):
        lw.Encoder(make_tiny_model("bert", 3), device="cpu", **options)


def test_the_command_line_refuses_an_unused_cap_and_writes_nothing(make_tiny_model, tmp_path):
    import subprocess
    import sys

    texts, out = tmp_path / "small.txt", tmp_path / "o.npz"
    texts.write_text("The bank raised rates.\n")
    model = make_tiny_model("bert", 3)
    command = [sys.executable, "-m", "layerwise", "extract", str(texts), "-o", str(out), "-m", str(model)]
    run = subprocess.run(
        [*command, "--no-streaming", "--max-device-memory", "64MB"], capture_output=True, text=True
    )
    assert run.returncode == 2 and "max_device_memory='64MB'" in run.stderr and not out.exists()


def test_a_block_size_for_a_model_that_fits_is_said_unused(make_tiny_model, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="layerwise"):
        enc = lw.Encoder(make_tiny_model("bert", 3), device="cpu", stream_block_tokens=64)
    assert not enc.streamed and "stream_block_tokens=64 is not used" in caplog.text
