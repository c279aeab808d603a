"""Tests that catch what the family tests missed (#81, item 6): a mutation audit of the family code
put back nine realistic bugs that no test caught. Each test here fails on one of them, and none
derives its expectation from the table it checks."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import layerwise as lw
from layerwise.cli import app
from layerwise.errors import StoreDamagedError

TEXTS = ["The bank raised rates.", "A longer sentence about the river bank and the fish."]

# the families the packed forward runs, written out here (not read from packed_decoder.py): a
# family dropped from its table would run transformers' padded forward and still pass every
# parity test
PACKED_DECODERS = ("gpt_neox", "opt", "phi", "phi3", "olmo", "olmo2")
PACKED_DECODERS_OF_DECODER_MODELS = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "gpt2",
)


@pytest.mark.parametrize("model_type", (*PACKED_DECODERS, "modernbert"))
def test_each_packed_family_runs_packed_and_says_so(model_type, family_folder):
    folder = family_folder(model_type)
    encoder = lw.Encoder(folder, device="cpu")
    assert encoder.engine.runs_packed("hidden_states", ())
    said = CliRunner().invoke(app, ["info", "-m", str(folder), "--json"])
    assert said.exit_code == 0 and json.loads(said.output)["forward"] == "packed", said.output


@pytest.mark.parametrize("model_type", PACKED_DECODERS_OF_DECODER_MODELS)
def test_each_packed_decoder_of_the_decoder_models_says_packed(model_type, decoder_folder):
    said = CliRunner().invoke(app, ["info", "-m", str(decoder_folder(model_type)), "--json"])
    assert said.exit_code == 0 and json.loads(said.output)["forward"] == "packed", said.output


def _hooked(model, ids: list[int], names: dict[str, str], layers: tuple[int, ...]) -> dict:
    """Each ``names[tap]`` module's output of ``layers``, hooked by its name in transformers."""
    recorded: dict = {}
    handles = []
    for tap, name in names.items():
        for i in layers:
            module = model.layers[i].get_submodule(name)

            def keep(module, args, out, key=(tap, i)):
                recorded[key] = (out[0] if isinstance(out, tuple) else out)[0].detach().numpy()

            handles.append(module.register_forward_hook(keep))
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        for handle in handles:
            handle.remove()
    return recorded


@pytest.mark.parametrize("method", ["hidden_states", "hooks"])
@pytest.mark.parametrize("model_type", ["gemma2", "olmo2"])
def test_a_post_norm_familys_taps_are_its_named_norms(model_type, method, decoder_folder, family_folder):
    """Post-norm blocks add their output norms' outputs: attn_out is post_attention_layernorm's and
    mlp_out post_feedforward_layernorm's, named here, not looked up in layerwise's table (their sum
    is the residual step whichever way round they are given)."""
    folder = decoder_folder(model_type) if model_type == "gemma2" else family_folder(model_type)
    encoder = lw.Encoder(folder, device="cpu", final_norm=False)
    names = {"attn_out": "post_attention_layernorm", "mlp_out": "post_feedforward_layernorm"}
    for text in TEXTS:
        (stack,) = encoder.extract([text], layers=[0, 1, 2], taps=list(names), method=method)
        recorded = _hooked(encoder.model, encoder.tokenize([text])[0].ids, names, (0, 1))
        for j, i in enumerate((0, 1)):
            for tap in names:
                np.testing.assert_allclose(stack.taps[tap][j], recorded[(tap, i)], atol=1e-5, rtol=1e-5)


def test_a_unigram_tokenizers_pieces_are_shown_as_words(family_folder):
    """Metaspace is a Unigram tokenizer's only decoder (T5's, DeBERTa-v3's): its ▁ is a space."""
    from layerwise._inputs.display import token_display

    encoder = lw.Encoder(family_folder("t5"), device="cpu")
    show = token_display(encoder.tokenizer)
    assert show("▁bank") == " bank" and show("ing") == "ing"


@pytest.mark.parametrize("version", ["dev", "", 3, None, "unknown"])
def test_a_record_that_lost_its_seal_with_a_version_that_is_not_one_is_damage(
    tmp_path, tiny_encoder, version
):
    """A ``layerwise_version`` that is not a version is no reason to trust a record without its seal."""
    path = tmp_path / "s.lw"
    lw.extract_to_store(tiny_encoder, ["one text", "and another"], path)
    document = json.loads((path / "zarr.json").read_text())
    record = document["attributes"]["layerwise"]
    del record["meta_sha256"]
    record["layerwise_version"] = version
    (path / "zarr.json").write_text(json.dumps(document))
    with pytest.raises(StoreDamagedError, match="lost its meta_sha256"):
        lw.open_store(path)


@pytest.mark.parametrize(("share", "streams"), [(0.78, False), (0.82, True)])
def test_the_default_streams_past_80_percent_of_the_free_memory_on_either_side(
    make_tiny_model, monkeypatch, share, streams
):
    from layerwise._model.streaming import fits

    model = make_tiny_model("bert", 3)
    needed = fits.weights_bytes(str(model), torch.float32)
    assert needed
    monkeypatch.setattr(fits, "free_bytes", lambda device: int(needed / share))
    assert lw.Encoder(model, device="cpu").streamed is streams


def test_a_one_layer_models_block_holds_its_layer_twice(tmp_path):
    """The last unit counts: a one-layer Llama's largest unit is its layer (the embeddings unit
    holds no weights but the word table, read by row)."""
    from decoder_models import decoder_config, sentencepiece_tokenizer
    from transformers import AutoModelForCausalLM

    tokenizer = sentencepiece_tokenizer()
    model = AutoModelForCausalLM.from_config(decoder_config("llama", tokenizer, 1))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    layer = sum(p.numel() * 4 for p in model.model.layers[0].parameters())
    norm = sum(p.numel() * 4 for p in model.model.norm.parameters())
    shape = lw.Encoder(tmp_path, device="cpu", streaming=True).models.streamed.shape()
    assert shape.weights in (2 * layer, 2 * (layer + norm))


def test_a_config_without_a_field_the_fast_reader_sets_aside_has_the_family_default(tmp_path):
    """``use_cache`` is a field PreTrainedConfig sets aside; a config.json without it still has
    BertConfig's default, as AutoConfig gives it."""
    from transformers import AutoConfig

    from layerwise._model.loading.plain import read_plain
    from layerwise._model.loading.source import default_model_path

    folder = tmp_path / "model"
    shutil.copytree(default_model_path(), folder)
    raw = json.loads((folder / "config.json").read_text())
    del raw["use_cache"]
    (folder / "config.json").write_text(json.dumps(raw))
    plain = read_plain(str(folder))
    assert plain is not None
    config, auto = plain[0], AutoConfig.from_pretrained(folder)
    assert config.use_cache is auto.use_cache is True
    for key, value in auto.to_dict().items():
        if key not in ("transformers_version", "architectures", "_name_or_path"):
            assert getattr(config, key, "absent") == value, key


@pytest.mark.parametrize("model_type", ["xlm", "albert"])
def test_a_model_whose_layer_outputs_are_not_its_states_is_read_from_transformers(model_type, tmp_path):
    """XLM keeps its attention and feed-forward outputs in parallel lists (a layer list's output is
    not a hidden state); ALBERT runs one shared layer at every depth. Read per layer, both return
    wrong numbers without an error: layerwise reads transformers' own states, by either method."""
    from sweep_models import reference_states, save_swept

    folder = save_swept(model_type, tmp_path / model_type)
    want = reference_states(folder, TEXTS)
    encoder = lw.Encoder(folder, device="cpu")
    for method in ("hidden_states", "hooks"):
        stacks = encoder.extract(TEXTS, layers="all", method=method)
        for stack, states in zip(stacks, want, strict=True):
            np.testing.assert_allclose(stack.hidden, np.asarray(states), atol=1e-5, rtol=0)
