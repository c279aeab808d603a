"""The packed and the streamed forwards leave the model object as it was: the same attributes on
every module, the same modules, the same forward methods and hooks, the same config (its attention
implementation included), the same tensors. They run on replicas (_model/forward/replica.py) and
keep what they learn beside the model (_model/notes.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import ud_sentences

import layerwise as lw


def snapshot(model: Any) -> dict[str, Any]:
    """Everything a run could change on ``model``: each module's type, attributes, hooks and
    tensors (by identity and version), and the config."""
    modules = {}
    for name, module in model.named_modules():
        hooks = [len(getattr(module, k)) for k in vars(module) if k.endswith("hooks")]
        tensors = [
            (n, id(t), t._version)
            for n, t in [*module._parameters.items(), *module._buffers.items()]
            if t is not None
        ]
        modules[name] = (type(module), sorted(vars(module)), "forward" in vars(module), hooks, tensors)
    config = model.config
    return {"modules": modules, "config": config.to_dict(), "attention": config._attn_implementation}


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3_text"])
def test_a_packed_extraction_leaves_the_model_as_it_was(arch, decoder_folder):
    encoder = lw.Encoder(decoder_folder(arch), device="cpu", concurrent_forwards=2, max_tokens=64)
    model = encoder.model
    before = snapshot(model)
    texts = ud_sentences(limit=12)
    assert encoder.engine.path == "packed"
    packed = encoder.extract(texts, layers="all", taps=("attn_out", "mlp_out"))
    assert snapshot(model) == before
    # the general path on that same model agrees: nothing the packed forward did is left on it
    general = lw.Encoder(decoder_folder(arch), device="cpu", packed=False).extract(texts, layers="all")
    for ours, theirs in zip(packed, general, strict=True):
        np.testing.assert_allclose(ours.hidden, theirs.hidden, atol=1e-5, rtol=0)


def test_a_streamed_extraction_leaves_the_config_as_it_was(decoder_folder):
    """A streamed model has no transformers model a user can reach (its weights are never whole):
    what the user's side holds is the config, and the skeleton runs on a copy of its own."""
    encoder = lw.Encoder(decoder_folder("qwen3"), device="cpu", streaming=True, stream_block_tokens=40)
    config = encoder.engine.models.config
    before = (config.to_dict(), config._attn_implementation)
    encoder.extract(ud_sentences(limit=8), layers="all")
    assert encoder.engine.path == "streamed"
    assert (config.to_dict(), config._attn_implementation) == before
    assert encoder.engine.streamed.model.skeleton.config is not config


def test_an_encoder_s_packed_extraction_leaves_the_model_as_it_was(default_model_dir):
    encoder = lw.Encoder(default_model_dir, device="cpu")
    model = encoder.model
    before = snapshot(model)
    encoder.extract(ud_sentences(limit=8), layers="all")
    assert encoder.engine.path == "packed"
    assert snapshot(model) == before
