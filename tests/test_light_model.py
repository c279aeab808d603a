"""The light model (the packed forward's weights without transformers' modeling code) is the
transformers model's weights to the byte, gives its hidden states, and steps aside for it whenever
the checkpoint or the call needs it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, TOKENIZER_FILES, tiny_config, ud_sentences

import layerwise as lw
from layerwise._model.loading.light import ACTIVATIONS, load_light_model
from layerwise._model.loading.weights_hash import weights_sha256

TEXTS = ud_sentences("dev", 24)


def hf_model(folder, dtype=torch.float32):
    from transformers import AutoModel

    return AutoModel.from_pretrained(folder, dtype=dtype).eval()


def save_model(model, folder, default_model_dir):
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(default_model_dir / name, folder / name)
    return folder


@pytest.mark.parametrize("kind", ["bert", "roberta", "electra", "xlm-roberta", "camembert"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_and_hash_equal_the_transformers_model(make_tiny_model, make_roberta_family, kind, dtype):
    folder = make_roberta_family(kind) if kind in ("xlm-roberta", "camembert") else make_tiny_model(kind, 2)
    theirs = hf_model(folder, dtype)
    from transformers import AutoConfig

    ours = load_light_model(str(folder), AutoConfig.from_pretrained(folder), dtype)
    assert ours is not None
    want, got = theirs.state_dict(), ours.state_dict()
    assert list(sorted(got)) == list(sorted(want))  # the same names, pooler included (none for ELECTRA)
    for name, tensor in want.items():
        assert got[name].dtype == dtype and torch.equal(got[name], tensor), name
    assert weights_sha256(ours) == weights_sha256(theirs)  # a store's metadata is the same either way


def test_default_encoder_runs_without_transformers_model_code():
    """The point of the light model: start-up without importing modeling_bert (1.5-2 s)."""
    code = (
        "import sys, layerwise as lw\n"
        "enc = lw.Encoder(device='cpu')\n"
        "v = enc.extract(['The bank raised rates.'])[0].hidden\n"
        "assert v.shape == (7, 7, 384), v.shape\n"
        "assert not enc.models.built\n"
        "heavy = ('transformers.modeling_utils', 'transformers.models.bert.modeling_bert', 'torch._dynamo')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_light_model_equals_hugging_face_forward_on_default_model(default_model_dir):
    light = lw.Encoder(default_model_dir, device="cpu", concurrent_forwards=1)
    padded = lw.Encoder(default_model_dir, device="cpu", packed=False)
    on_hf_modules = lw.Encoder(default_model_dir, device="cpu", concurrent_forwards=1)
    assert on_hf_modules.model is on_hf_modules.engine.packed.model  # packed, on transformers' modules
    assert not light.models.built and padded.models.built
    ours = light.extract(TEXTS)
    for a, b, c in zip(ours, padded.extract(TEXTS), on_hf_modules.extract(TEXTS), strict=True):
        np.testing.assert_allclose(a.hidden, b.hidden, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(a.hidden, c.hidden)  # the same torch ops: the same bits
    assert not light.models.built  # extraction never needed the transformers model


def test_checkpoint_with_a_head_loads_behind_its_prefix(make_tiny_mlm):
    """BertForMaskedLM: "bert.embeddings…", "cls.predictions…", and no pooler (layerwise never uses it)."""
    from layerwise._model.loading.source import load_model

    folder = make_tiny_mlm("bert")
    enc = lw.Encoder(folder, device="cpu")
    assert not enc.models.built and not hasattr(enc.models.current, "pooler")
    padded = lw.Encoder(folder, device="cpu", packed=False)
    for a, b in zip(enc.extract(TEXTS[:8]), padded.extract(TEXTS[:8]), strict=True):
        np.testing.assert_allclose(a.hidden, b.hidden, atol=1e-5, rtol=0)
    # transformers fills the missing pooler with new random numbers at every load: the hash leaves it
    # out, so that a store of such a model can be resumed, whichever way the model was loaded
    first, second = (load_model(str(folder), "m", torch.float32) for _ in range(2))
    assert not torch.equal(first.pooler.dense.weight, second.pooler.dense.weight)
    assert weights_sha256(first) == weights_sha256(second) == weights_sha256(enc.models.current)


def test_store_of_a_model_without_pooler_resumes(make_tiny_mlm, tmp_path):
    folder = make_tiny_mlm("bert")
    path = tmp_path / "s.lw"
    lw.extract_to_store(lw.Encoder(folder, device="cpu", packed=False), TEXTS[:6], path, progress=False)
    again = lw.extract_to_store(lw.Encoder(folder, device="cpu"), TEXTS[:6], path, progress=False)
    assert again.n_written == 0 and again.n_already_committed == 6


def _without_pooler(folder, target):
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, target)
    state = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in state.items() if k != "pooler.dense.bias"}, target / "model.safetensors",
              metadata={"format": "pt"})  # fmt: skip
    return target


@pytest.mark.parametrize("case", ["pickle", "half_a_pooler", "activation", "relative_positions"])
def test_other_checkpoints_load_with_transformers(make_tiny_model, tmp_path, default_model_dir, case):
    """Whatever needs Hugging Face's loading logic or modules takes the transformers path, as before."""
    from transformers import AutoModel

    if case == "half_a_pooler":
        folder = _without_pooler(make_tiny_model("bert", 2), tmp_path / "m")
    else:
        config = tiny_config("bert", 2)
        if case == "activation":
            config.hidden_act = "gelu_10"
            assert "gelu_10" not in ACTIVATIONS
        if case == "relative_positions":
            config.position_embedding_type = "relative_key"
        torch.manual_seed(0)
        folder = save_model(AutoModel.from_config(config), tmp_path, default_model_dir)
        if case == "pickle":  # pytorch_model.bin only
            from safetensors.torch import load_file

            torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
            (folder / "model.safetensors").unlink()
    enc = lw.Encoder(folder, device="cpu")
    assert enc.models.built
    if case != "relative_positions":  # packed on the transformers modules
        assert enc.engine.packed is not None and enc.engine.packed.model is enc.model
    padded = lw.Encoder(folder, device="cpu", packed=False)
    for a, b in zip(enc.extract(TEXTS[:6]), padded.extract(TEXTS[:6]), strict=True):
        np.testing.assert_allclose(a.hidden, b.hidden, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_are_transformers_own_to_the_bit(name):
    from transformers.activations import ACT2FN

    x = torch.linspace(-12, 12, 20001) * torch.rand(20001)
    assert torch.equal(ACTIVATIONS[name](x), ACT2FN[name](x))


def test_a_damaged_weights_file_is_named_when_the_light_model_cannot_read_it(make_tiny_model, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(make_tiny_model("bert", 2), folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])  # cut short
    with pytest.raises(lw.ModelLoadError, match=r"its weights file .*model\.safetensors cannot be read"):
        lw.Encoder(folder, device="cpu")


def test_a_misshapen_weight_is_still_refused(make_tiny_model, tmp_path):
    """A weight whose shape differs from config.json: the transformers loader's error, not a light model."""
    folder = tmp_path / "m"
    shutil.copytree(make_tiny_model("bert", 2), folder)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 48
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(lw.ModelLoadError, match="shape"):
        lw.Encoder(folder, device="cpu")


def test_transformers_model_built_on_demand_takes_over(make_tiny_model):
    """Encoder.model builds the transformers model; from then on the packed forward runs on its
    modules, so weights edited through it are the weights every path uses."""
    enc = lw.Encoder(make_tiny_model("bert", 3), device="cpu", concurrent_forwards=1)
    before = enc.extract(TEXTS[:4])
    assert not enc.models.built
    model = enc.model
    assert enc.models.built and enc.engine.packed.model is model and enc.model is model
    with torch.no_grad():
        model.encoder.layer[1].output.dense.weight.mul_(2.0)
    after = enc.extract(TEXTS[:4])
    hooks = enc.extract(TEXTS[:4], method="hooks")  # the transformers forward, same edited weights
    for a, b, c in zip(before, after, hooks, strict=True):
        np.testing.assert_allclose(a.hidden[:2], b.hidden[:2], atol=1e-6, rtol=0)  # below the edit
        assert not np.allclose(a.hidden[2:], b.hidden[2:], atol=1e-3)
        np.testing.assert_allclose(b.hidden, c.hidden, atol=1e-5, rtol=0)


def test_taps_build_the_transformers_model(make_tiny_model):
    enc = lw.Encoder(make_tiny_model("bert", 3), device="cpu")
    assert not enc.models.built
    tapped = enc.extract(TEXTS[:3], taps=["intermediate"], layers=[1, 3])
    assert enc.models.built and tapped[0].taps["intermediate"].shape[0] == 2
    padded = lw.Encoder(make_tiny_model("bert", 3), device="cpu", packed=False)
    want = padded.extract(TEXTS[:3], taps=["intermediate"], layers=[1, 3])
    for a, b in zip(tapped, want, strict=True):
        np.testing.assert_array_equal(a.taps["intermediate"], b.taps["intermediate"])
