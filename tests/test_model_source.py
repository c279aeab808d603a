"""Loading is strict: a checkpoint that would leave random weights in the model is refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
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

    from layerwise._model.loading.weights_hash import weights_sha256

    model = lw.Encoder(model_copy, device="cpu").model
    first = weights_sha256(model)
    assert weights_sha256(model) == first  # remembered: a Ray actor writing many shards hashes once
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[0, 0] += 1.0  # an in-place edit bumps the tensor's version
    assert weights_sha256(model) != first


def test_a_folder_without_tokenizer_files_is_refused_naming_them(model_copy):
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (model_copy / name).unlink()
    with pytest.raises(lw.ModelLoadError, match=r"has no tokenizer: none of tokenizer\.json, vocab\.txt"):
        lw.Encoder(model_copy, device="cpu")


def _other_wordpiece(folder, size: int) -> None:
    """A WordPiece tokenizer.json trained here on a few words: [PAD]=0 [UNK]=1 [CLS]=2 ... of ``size``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=size, special_tokens=specials)
    tokenizer.train_from_iterator(["the bank raised rates on the river bank"] * 50, trainer)
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "vocab.txt").unlink()


def test_a_tokenizer_with_ids_past_the_embedding_table_is_refused(model_copy):
    config = json.loads((model_copy / "config.json").read_text())
    config["vocab_size"] = 30000  # the tokenizer's ids run to 30521
    (model_copy / "config.json").write_text(json.dumps(config))
    _rewrite_weights(model_copy, lambda w: {
        k: (v[:30000] if k == "embeddings.word_embeddings.weight" else v) for k, v in w.items()
    })  # fmt: skip
    with pytest.raises(lw.ModelLoadError, match=r"522 token ids at or past the model's vocab size 30,000"):
        lw.Encoder(model_copy, device="cpu")


def test_a_tokenizer_far_smaller_than_the_table_is_said(model_copy, caplog):
    import logging

    _other_wordpiece(model_copy, 60)
    with caplog.at_level(logging.WARNING, logger="layerwise"):
        encoder = lw.Encoder(model_copy, device="cpu")
    assert "the tokenizer has" in caplog.text and "embedding table of 30,522 rows" in caplog.text
    assert encoder.tokenize(["the bank"])[0].ids[0] == 2  # its own [CLS]


@pytest.mark.parametrize("packed", [True, False])
def test_weights_the_config_does_not_use_are_refused(model_copy, packed):
    config = json.loads((model_copy / "config.json").read_text())
    config["num_hidden_layers"] = 2  # the checkpoint has 3
    (model_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        lw.ModelLoadError, match=r"16 weights of the checkpoint are not used .*encoder\.layer\.2\."
    ):
        lw.Encoder(model_copy, device="cpu", packed=packed)


def test_a_head_beside_the_encoder_is_not_an_unused_weight(tmp_path, make_tiny_mlm):
    encoder = lw.Encoder(make_tiny_mlm("bert"), device="cpu")  # bert.* and cls.predictions.*
    assert encoder.n_layers == 2


def test_an_integer_bias_is_cast_as_transformers_casts_it(model_copy, make_tiny_model):
    import torch

    def as_int(weights):
        key = "encoder.layer.0.attention.self.query.bias"
        weights[key] = torch.round(weights[key] * 100).to(torch.int32)
        return weights

    _rewrite_weights(model_copy, as_int)
    text = ["the bank raised rates"]
    packed = lw.Encoder(model_copy, device="cpu").extract(text)[0].hidden
    reference = lw.Encoder(model_copy, device="cpu", packed=False).extract(text)[0].hidden
    np.testing.assert_allclose(packed, reference, atol=1e-5)


def test_a_symlink_loop_is_a_local_path_never_a_hub_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "loop").symlink_to("loop")
    with pytest.raises(lw.ModelLoadError, match=r"'models/loop' is a symbolic link that leads nowhere"):
        lw.Encoder("models/loop", device="cpu")
