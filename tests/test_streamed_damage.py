"""A damaged checkpoint is named when a model opens it, streamed or in memory: a weights file cut
short, too short to hold a header, empty, or with a header that is not one; a shard deleted, an
index that names a missing file, that is not JSON, that places a tensor in a file without it, or
that leaves one out; a pickle file cut short; a config or tokenizer file that is not JSON. Each is
a ModelLoadError naming the file (exit 2 on the command line, nothing written)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import layerwise as lw
from layerwise.errors import ModelLoadError

TEXTS = ["The bank raised rates.", "She sat on the river bank."]
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def sharded(decoder_folder, tmp_path_factory) -> Path:
    """The tiny Llama saved again in shards of a few kB (an index and several files)."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("sharded-llama")
    AutoModelForCausalLM.from_pretrained(decoder_folder("llama")).save_pretrained(
        folder, max_shard_size="40KB"
    )
    for file in decoder_folder("llama").iterdir():
        if file.name.startswith("tokenizer") or file.name == "special_tokens_map.json":
            shutil.copy(file, folder / file.name)
    assert len(json.loads((folder / INDEX).read_text())["weight_map"]) > 3
    return folder


def _copy(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(folder, copy)
    return copy


def _without_dtype(data: bytes) -> bytes:
    """The file with one tensor's ``dtype`` taken out of its header (the same length of JSON)."""
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + size])
    name = next(k for k in header if k != "__metadata__")
    del header[name]["dtype"]
    text = json.dumps(header).encode().ljust(size)
    return data[:8] + text + data[8 + size :]


DAMAGE = {
    "cut short": lambda data: data[: len(data) // 2],
    "100 bytes": lambda data: data[:100],
    "empty": lambda data: b"",
    "a header without dtype": _without_dtype,
}


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_weights_file_is_named_when_a_model_opens_it(decoder_folder, tmp_path, damage, streaming):
    model = _copy(decoder_folder("llama"), tmp_path)
    weights = model / "model.safetensors"
    weights.write_bytes(DAMAGE[damage](weights.read_bytes()))
    with pytest.raises(ModelLoadError, match=r"model\.safetensors cannot be read .* damaged or incomplete"):
        lw.Encoder(model, device="cpu", streaming=streaming)


@pytest.mark.parametrize(
    "file, content",
    [
        ("config.json", "{x"),
        ("config.json", ""),
        ("tokenizer.json", '{"version": '),
        ("tokenizer_config.json", "["),
    ],
)
def test_a_folder_file_that_is_not_json_is_named(decoder_folder, tmp_path, file, content):
    """#81, 16: transformers named the folder (or only the JSON error) for these."""
    model = _copy(decoder_folder("llama"), tmp_path)
    (model / file).write_text(content)
    with pytest.raises(ModelLoadError, match=rf"its file .*{file} is not JSON"):
        lw.Encoder(model, device="cpu")


@pytest.mark.parametrize("keep", [0, 0.5])
def test_a_damaged_pickle_weights_file_is_named(decoder_folder, tmp_path, keep):
    import torch
    from transformers import AutoModelForCausalLM

    model = _copy(decoder_folder("llama"), tmp_path)
    (model / "model.safetensors").unlink()
    pickled = model / "pytorch_model.bin"
    torch.save(AutoModelForCausalLM.from_pretrained(decoder_folder("llama")).state_dict(), pickled)
    pickled.write_bytes(pickled.read_bytes()[: int(pickled.stat().st_size * keep)])
    with pytest.raises(ModelLoadError, match=r"its weights file .*pytorch_model\.bin cannot be read"):
        lw.Encoder(model, device="cpu")


@pytest.mark.parametrize("streaming", [False, True])
def test_a_damaged_shard_or_index_is_named(sharded, tmp_path, streaming):
    shards = sorted(sharded.glob("model-*.safetensors"))
    cases = {
        "a shard deleted": lambda m: (m / shards[1].name).unlink(),
        "an index naming a missing file": lambda m: _edit_index(
            m, lambda w: {k: "gone.safetensors" for k in w}
        ),
        "trailing garbage in the index": lambda m: (m / INDEX).write_text(
            (sharded / INDEX).read_text() + "}x"
        ),
        "a tensor placed in the wrong file": lambda m: _edit_index(m, _misplace),
        "a shard cut short": lambda m: (m / shards[0].name).write_bytes(shards[0].read_bytes()[:1000]),
    }
    said = {}
    for case, damage in cases.items():
        model = tmp_path / case.replace(" ", "-")
        shutil.copytree(sharded, model)
        damage(model)
        with pytest.raises(ModelLoadError) as raised:
            lw.Encoder(model, device="cpu", streaming=streaming)
        said[case] = str(raised.value)
    assert "is missing" in said["a shard deleted"] and shards[1].name in said["a shard deleted"]
    assert "gone.safetensors is missing" in said["an index naming a missing file"]
    assert "is not a safetensors index" in said["trailing garbage in the index"]
    assert "which does not hold it" in said["a tensor placed in the wrong file"]
    assert f"{shards[0].name} cannot be read" in said["a shard cut short"]


def _edit_index(model: Path, edit) -> None:
    index = json.loads((model / INDEX).read_text())
    index["weight_map"] = edit(index["weight_map"])
    (model / INDEX).write_text(json.dumps(index))


def _misplace(weight_map: dict[str, str]) -> dict[str, str]:
    files = sorted(set(weight_map.values()))
    key = next(k for k, f in weight_map.items() if f == files[0])
    return {**weight_map, key: files[1]}


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize(
    "damage, said",
    [
        (
            "an entry left out",
            r"model-\d+-of-\d+\.safetensors holds 'model\.layers\.1\.mlp\.up_proj\.weight' "
            r"that model\.safetensors\.index\.json does not list",
        ),
        (
            "an entry pointed at another shard",
            r"places '.*' in model-\d+-of-\d+\.safetensors, which does not "
            r"hold it \(model-\d+-of-\d+\.safetensors holds it\)",
        ),
        (
            "an entry no shard holds",
            r"places 'model\.layers\.9\.mlp\.up_proj\.weight' in .*which does not hold",
        ),
    ],
)
def test_an_index_that_disagrees_with_its_shards_is_refused(sharded, tmp_path, damage, said, streaming):
    """#81, 15: transformers reads whole shards, so these loaded in memory with the right numbers
    and without a word; an index that is wrong is a download that is wrong, and is named, in
    memory and streamed."""
    model = _copy(sharded, tmp_path)
    edits = {
        "an entry left out": lambda w: {
            k: f for k, f in w.items() if k != "model.layers.1.mlp.up_proj.weight"
        },
        "an entry pointed at another shard": _misplace_within,
        "an entry no shard holds": lambda w: {
            **w,
            "model.layers.9.mlp.up_proj.weight": sorted(w.values())[0],
        },
    }
    _edit_index(model, edits[damage])
    with pytest.raises(ModelLoadError, match=said):
        lw.Encoder(model, device="cpu", streaming=streaming)


def _misplace_within(weight_map: dict[str, str]) -> dict[str, str]:
    """One tensor of a shard holding several pointed at another shard (both stay listed)."""
    files = sorted(set(weight_map.values()))
    crowded = next(f for f in files if sum(v == f for v in weight_map.values()) > 1)
    key = next(k for k, f in weight_map.items() if f == crowded)
    return {**weight_map, key: next(f for f in files if f != crowded)}


def test_a_weight_no_file_holds_is_named_before_the_run(sharded, tmp_path):
    """A tensor the model needs that no shard holds (a shard written without it): refused when the
    model opens, naming the weight, not a KeyError midway through a block."""
    from safetensors.torch import load_file, save_file

    model = _copy(sharded, tmp_path)
    weight_map = json.loads((model / INDEX).read_text())["weight_map"]
    name = "model.layers.2.self_attn.o_proj.weight"
    shard = model / weight_map[name]
    tensors = load_file(shard)
    del tensors[name]
    save_file(tensors, shard, metadata={"format": "pt"})
    _edit_index(model, lambda w: {k: f for k, f in w.items() if k != name})
    with pytest.raises(ModelLoadError, match=rf"holds no tensor '{name}'"):
        lw.Encoder(model, device="cpu", streaming=True)


def test_the_command_line_names_a_damaged_checkpoint_and_writes_nothing(decoder_folder, tmp_path):
    model = _copy(decoder_folder("llama"), tmp_path)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    texts, out = tmp_path / "small.txt", tmp_path / "o.npz"
    texts.write_text("\n".join(TEXTS) + "\n")
    command = [
        sys.executable,
        "-m",
        "layerwise",
        "extract",
        str(texts),
        "-o",
        str(out),
        "-m",
        str(model),
        "--streaming",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    assert "model.safetensors cannot be read" in run.stderr and "Traceback" not in run.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model", "small.txt"]
