"""A model placed by accelerate (device_map, max_device_memory, offload_folder; quantize): every hidden
state equals the model on one device, a copy that comes back as zeros stops the run, and every bad
placement is refused by name before anything loads, leaving nothing behind."""

from __future__ import annotations

import errno
import gc
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_same_stacks

import layerwise as lw
from layerwise.errors import ModelLoadError, OptionError

TEXTS = [
    "The bank raised rates.",
    "She sat on the river bank and watched the water for a long while.",
    "A much longer sentence about nothing in particular, which goes on and on, so that it is cut.",
]
PAIRS = [("Where is the bank?", "By the river."), ("Who wrote it?", "Nobody knows who wrote it.")]


def _half_on_disk(prefix: str, n_layers: int, first: list[str], last: list[str]) -> dict[str, str]:
    """The first half of the layers (and ``first``) on the CPU, the second half (and ``last``) on disk."""
    layers = {f"{prefix}{i}": "cpu" if i < n_layers // 2 else "disk" for i in range(n_layers)}
    return {**dict.fromkeys(first, "cpu"), **layers, **dict.fromkeys(last, "disk")}


@pytest.fixture(scope="module")
def bert(make_tiny_model):
    folder = make_tiny_model("bert", 4)
    device_map = _half_on_disk("encoder.layer.", 4, ["embeddings"], ["pooler"])
    return lw.Encoder(folder, device="cpu"), lw.Encoder(folder, device_map=device_map)


def test_an_encoder_with_half_its_layers_on_disk_gives_every_layer_of_the_model_in_memory(bert):
    memory, placed = bert
    assert set(placed.model.hf_device_map.values()) == {"cpu", "disk"}
    assert placed.engine.settings.packed is False  # accelerate's hooks run in transformers' forward
    assert_same_stacks(placed.extract(TEXTS, layers="all"), memory.extract(TEXTS, layers="all"))
    assert_same_stacks(placed.extract(pairs=PAIRS, layers="all"), memory.extract(pairs=PAIRS, layers="all"))
    long = [" ".join(TEXTS * 3)]  # past the tiny model's 32 tokens: windows
    windowed = {"layers": "all", "long_texts": "window", "stride": 4}
    assert_same_stacks(placed.extract(long, **windowed), memory.extract(long, **windowed))
    assert_same_stacks(
        placed.extract(TEXTS, layers="all", method="hooks"), memory.extract(TEXTS, layers="all")
    )
    np.testing.assert_allclose(
        placed.embed(TEXTS, layers="all"), memory.embed(TEXTS, layers="all"), atol=1e-5
    )
    hashes = [enc.run_meta(lw.OutputPlan())["weights_sha256"] for enc in (placed, memory)]
    assert hashes[0] == hashes[1]  # the offloaded weights hashed from where accelerate reads them


@pytest.mark.parametrize("final_norm", [True, False, "all"])
def test_a_decoder_with_half_its_layers_on_disk_equals_the_model_in_memory(decoder_folder, final_norm):
    folder = decoder_folder("llama")
    memory = lw.Encoder(folder, device="cpu", final_norm=final_norm)
    n = memory.n_layers
    device_map = _half_on_disk("layers.", n, ["embed_tokens", "rotary_emb"], ["norm"])
    placed = lw.Encoder(folder, device_map=device_map, final_norm=final_norm)
    assert_same_stacks(placed.extract(TEXTS, layers="all"), memory.extract(TEXTS, layers="all"))


def test_auto_with_a_memory_cap_offloads_what_does_not_fit_and_gives_the_same_numbers(make_tiny_model):
    folder = make_tiny_model("bert", 4)
    memory = lw.Encoder(folder, device="cpu")
    placed = lw.Encoder(folder, device_map="auto", max_device_memory="60KB")
    assert "disk" in placed.model.hf_device_map.values()
    assert_same_stacks(placed.extract(TEXTS, layers="all"), memory.extract(TEXTS, layers="all"))
    meta = placed.run_meta(lw.OutputPlan())
    assert meta["device_map"] == "auto" and meta["max_device_memory"] == "60KB"


def test_an_asked_for_offload_loads_without_accelerates_meta_device_warning(make_tiny_model, caplog):
    import logging

    with caplog.at_level(logging.WARNING):
        placed = lw.Encoder(make_tiny_model("bert", 4), device_map="auto", max_device_memory="60KB")
    assert "disk" in placed.model.hf_device_map.values()
    assert not [r for r in caplog.records if "meta device" in r.getMessage()], caplog.text
    big_modeling = logging.getLogger("accelerate.big_modeling")
    assert not big_modeling.filters  # the filter goes with the load
    with caplog.at_level(logging.WARNING):
        big_modeling.warning("Some parameters are on the meta device because they were offloaded.")
    assert "meta device" in caplog.text  # accelerate's own loads, outside layerwise's, still warn


def test_a_layer_whose_states_come_back_all_zeros_stops_the_run(bert):
    """What transformers users see with a model spread over GPUs (issue 36636): the later layers'
    hidden states all zeros. A failed copy, never a residual stream: refused, naming the layers."""
    placed = bert[1]
    layer = placed.model.encoder.layer[2]
    # layer 2's output is zeros (hidden state 3, as layer 3 receives it: a hook on the user's model
    # runs ahead of the reading), and layer 3 gives zeros again: hidden state 4 (LayerNorm of zeros)
    handle = layer.register_forward_hook(lambda module, args, out: out * 0)  # a tensor in transformers 5
    try:
        with pytest.raises(ModelLoadError, match=r"layers \[3, 4\] came back all zeros"):
            placed.extract(TEXTS, layers="all")
    finally:
        handle.remove()
    assert placed.extract(TEXTS[:1], layers=-1)[0].hidden.any()


def test_a_device_map_file_is_read(make_tiny_model, tmp_path):
    folder = make_tiny_model("bert", 4)
    path = tmp_path / "placement.json"
    path.write_text(json.dumps(_half_on_disk("encoder.layer.", 4, ["embeddings"], ["pooler"])))
    placed = lw.Encoder(folder, device_map=str(path))
    assert placed.model.hf_device_map["encoder.layer.3"] == "disk"


@pytest.mark.parametrize(
    ("device_map", "message"),
    [
        ({"": "cuda:3"}, r"puts '' on 'cuda:3', but this machine has \d+ CUDA GPU"),
        ({"": 1}, r"puts '' on 1, but this machine has"),
        (
            {"embeddings": "cpu", "encoder": "cpu", "pooler": "cpu", "decoder": "cpu"},
            r"\['decoder'\], not modules",
        ),
        ({"embeddings": "cpu", "encoder": "cpu"}, r"gives no device to 'pooler"),
        ({"": "gpu"}, r"'gpu', which is not a device"),
        ("everywhere", r"is not a device map"),
        ("missing.json", r"no such file"),
    ],
)
def test_a_bad_device_map_is_refused_naming_it(make_tiny_model, device_map, message):
    with pytest.raises(OptionError, match=message):
        lw.Encoder(make_tiny_model("bert", 2), device_map=device_map)


def test_memory_caps_by_device(make_tiny_model):
    with pytest.raises(OptionError, match="only a device map uses"):
        lw.Settings(max_device_memory="0=2GB,cpu=8GB")
    with pytest.raises(OptionError, match="'disk' is not a device"):
        lw.Settings(device_map="auto", max_device_memory="cpu=8GB,disk=1TB")
    with pytest.raises(OptionError, match=r"caps 0, but this machine has"):
        lw.Encoder(make_tiny_model("bert", 2), device_map="auto", max_device_memory="0=2GB,cpu=1GB")
    with pytest.raises(OptionError, match="two ways to hold a model"):
        lw.Settings(streaming=True, device_map="auto")


def test_an_offload_folder_that_cannot_be_written_is_refused_and_left_as_it_was(make_tiny_model, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(OptionError, match=r"offload_folder=.* cannot be written"):
        lw.Encoder(make_tiny_model("bert", 2), device_map={"": "disk"}, offload_folder=str(blocker / "sub"))
    assert blocker.read_text() == "not a folder" and sorted(tmp_path.iterdir()) == [blocker]


def test_an_offload_folder_that_fills_up_names_it_and_keeps_only_what_it_held(
    make_tiny_model, tmp_path, monkeypatch
):
    from transformers import AutoModel

    folder = tmp_path / "offload"
    folder.mkdir()
    (folder / "kept.txt").write_text("the user's")

    def filling(*args, offload_folder, **kwargs):  # transformers writing the offloaded weights
        (Path(offload_folder) / "layer.dat").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(AutoModel, "from_pretrained", filling)
    with pytest.raises(ModelLoadError, match="filled up"):
        lw.Encoder(make_tiny_model("bert", 2), device_map={"": "disk"}, offload_folder=str(folder))
    assert sorted(p.name for p in folder.iterdir()) == ["kept.txt"]


def test_the_temporary_offload_folder_goes_with_the_model(make_tiny_model):
    placed = lw.Encoder(make_tiny_model("bert", 2), device_map={"": "disk"})
    folder = Path(placed.models.placement.kwargs["offload_folder"])
    assert folder.is_dir() and placed.embed(TEXTS[:1]).shape[0] == 1
    del placed
    gc.collect()
    assert not folder.exists()


def test_quantised_weights_are_refused_on_the_cpu(make_tiny_model):
    with pytest.raises(OptionError, match=r"quantize='8bit' runs bitsandbytes' CUDA kernels.*device is cpu"):
        lw.Encoder(make_tiny_model("bert", 2), device="cpu", quantize="8bit")
    with pytest.raises(OptionError, match="quantize='3bit' is not valid"):
        lw.Settings(quantize="3bit")


def test_a_given_offload_folder_is_left_as_it_was_when_the_model_goes(make_tiny_model, tmp_path):
    """A folder the run made (it did not exist) goes with the model, as a temporary one does; a
    folder that was there keeps what it held, and only that (what the load wrote into it goes)."""
    made = tmp_path / "made-here"
    placed = lw.Encoder(make_tiny_model("bert", 2), device_map={"": "disk"}, offload_folder=str(made))
    assert made.is_dir() and placed.embed(TEXTS[:1]).shape[0] == 1
    del placed
    gc.collect()
    assert not made.exists()
    given = tmp_path / "given"
    given.mkdir()
    (given / "kept.txt").write_text("the user's")
    placed = lw.Encoder(make_tiny_model("bert", 2), device_map={"": "disk"}, offload_folder=str(given))
    (given / "layer.dat").write_bytes(b"offloaded")  # what accelerate writes for a .bin checkpoint
    del placed
    gc.collect()
    assert sorted(p.name for p in given.iterdir()) == ["kept.txt"]
