"""Loading is strict: a checkpoint that would leave random weights in the model is refused."""

from __future__ import annotations

import json
import shutil

import pytest

import layerwise as lw


@pytest.fixture
def model_copy(tmp_path, make_tiny_model):
    folder = tmp_path / "model"
    shutil.copytree(make_tiny_model("bert"), folder)
    return folder


def _rewrite_weights(folder, change):
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    save_file(change(weights), folder / "model.safetensors", metadata={"format": "pt"})


def test_missing_layer_weights_are_refused(model_copy):
    _rewrite_weights(model_copy, lambda w: {k: v for k, v in w.items() if ".layer.1." not in k})
    with pytest.raises(lw.ModelLoadError, match=r"16 weights are missing .*encoder\.layer\.1\."):
        lw.Encoder(model_copy, device="cpu")


def test_wrapper_prefix_is_refused_with_a_hint(model_copy):
    _rewrite_weights(model_copy, lambda w: {f"model.encoder_model.{k}": v for k, v in w.items()})
    with pytest.raises(lw.ModelLoadError, match=r"random.*'model\.encoder_model\..*wrapper's prefix"):
        lw.Encoder(model_copy, device="cpu")


def test_missing_pooler_is_allowed_and_numbers_equal(model_copy, make_tiny_model):
    _rewrite_weights(model_copy, lambda w: {k: v for k, v in w.items() if not k.startswith("pooler.")})
    text = ["the bank raised rates"]
    a = lw.Encoder(model_copy, device="cpu").extract(text)[0].hidden
    b = lw.Encoder(make_tiny_model("bert"), device="cpu").extract(text)[0].hidden
    assert (a == b).all()


def test_unsupported_architecture_is_refused(model_copy):
    config = json.loads((model_copy / "config.json").read_text())
    config["model_type"] = "gpt2"
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(lw.ModelLoadError, match="is a 'gpt2' model; layerwise extracts encoder layers"):
        lw.Encoder(model_copy, device="cpu")


def test_config_that_does_not_match_the_weights(model_copy):
    config = json.loads((model_copy / "config.json").read_text())
    config["intermediate_size"] = 128
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(lw.ModelLoadError, match=r"shapes do not match its config\.json"):
        lw.Encoder(model_copy, device="cpu")


def test_device_that_cannot_run_a_model(make_tiny_model):
    with pytest.raises(lw.OptionError, match="device='meta' cannot run a model"):
        lw.Encoder(make_tiny_model("bert"), device="meta")


def test_pickle_checkpoint_torch_refuses_is_a_clean_error(model_copy):
    import argparse

    import torch
    from safetensors.torch import load_file

    weights = load_file(model_copy / "model.safetensors")
    weights["training_args"] = argparse.Namespace(lr=1e-4)  # what a careless trainer pickles in
    torch.save(weights, model_copy / "pytorch_model.bin")
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(
        lw.ModelLoadError, match=r"pickle checkpoint \(pytorch_model.bin\) holds argparse.Namespace"
    ):
        lw.Encoder(model_copy, device="cpu")


def test_plain_pickle_state_dict_still_loads(model_copy, make_tiny_model):
    import numpy as np
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(model_copy / "model.safetensors"), model_copy / "pytorch_model.bin")
    (model_copy / "model.safetensors").unlink()
    got = lw.Encoder(model_copy, device="cpu").extract(["a bank"])[0].hidden
    want = lw.Encoder(make_tiny_model("bert"), device="cpu").extract(["a bank"])[0].hidden
    np.testing.assert_array_equal(got, want)


def test_weights_hash_is_remembered_until_a_weight_changes(model_copy):
    import torch

    from layerwise.model_source import weights_sha256

    model = lw.Encoder(model_copy, device="cpu").model
    first = weights_sha256(model)
    assert weights_sha256(model) == first  # remembered: a Ray actor writing many shards hashes once
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[0, 0] += 1.0  # an in-place edit bumps the tensor's version
    assert weights_sha256(model) != first
