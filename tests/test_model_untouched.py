"""The packed, the streamed and the general forwards leave the model object as it was, during a run
and after it: the same attributes on every module, the same modules, the same forward methods and
hooks, the same config (its attention implementation included), the same tensors. They run on
replicas (_model/forward/replica.py) and keep what they learn beside the model (_model/notes.py).
Hooks a user puts on the model run in every forward that runs its modules, from the next run on."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
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


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_the_general_path_cuts_hooks_and_switches_attention_on_a_replica(
    arch, make_tiny_model, decoder_folder
):
    """transformers' own forward, cut at layer 1, read by hooks, with eager attention for the
    probabilities: the user's model keeps its layer list and attention implementation while it runs
    (a hook of the user's sees them), and its snapshot after."""
    folder = make_tiny_model("bert", 3) if arch == "bert" else decoder_folder(arch)
    encoder = lw.Encoder(folder, device="cpu", packed=False)
    model = encoder.model
    assert model.config._attn_implementation == "sdpa"  # the probabilities need eager attention
    layers = model.encoder.layer if arch == "bert" else model.layers
    before = snapshot(model)
    seen: list[tuple[int, str]] = []
    handle = layers[0].register_forward_hook(
        lambda module, args, output: seen.append((len(layers), model.config._attn_implementation))
    )
    for method in ("hooks", "hidden_states"):
        stack = encoder.extract(
            ["the bank by the river"], layers=[1], method=method, taps=["attention_probs"]
        )[0]
        assert stack.taps["attention_probs"].shape[:2] == (1, model.config.num_attention_heads)
    handle.remove()
    assert seen == [(3 if arch == "bert" else len(layers), "sdpa")] * 2
    assert snapshot(model) == before


class Recorder:
    """A user's recorder: its method is the hook (a replica must call this object, not a copy)."""

    def __init__(self) -> None:
        self.calls = 0

    def hook(self, module: Any, args: Any, output: Any) -> Any:
        self.calls += 1
        return output * 0 if isinstance(output, torch.Tensor) else (output[0] * 0, *output[1:])


@pytest.mark.parametrize("arch", ["bert", "llama"])
@pytest.mark.parametrize("packed", [True, False])
def test_a_hook_put_on_the_model_runs_from_the_next_run_on_until_removed(
    arch, packed, make_tiny_model, decoder_folder
):
    folder = make_tiny_model("bert", 3) if arch == "bert" else decoder_folder(arch)
    encoder = lw.Encoder(folder, device="cpu", packed=packed)
    texts = ["the bank by the river", "a loan"]
    plain = encoder.extract(texts, layers="all")
    if packed:
        assert encoder.engine.path == "packed"  # a packed BERT runs its own kernels: hooked, the modules
    layers = encoder.model.encoder.layer if arch == "bert" else encoder.model.layers
    recorder = Recorder()
    handle = layers[1].register_forward_hook(recorder.hook)
    hooked = encoder.extract(texts, layers="all")
    assert recorder.calls >= 1  # the user's own object, called in layerwise's forward
    for stack in hooked:
        assert not stack.hidden[2].any()  # layer 2's output, zeroed by the hook
        np.testing.assert_array_equal(stack.hidden[1], plain[hooked.index(stack)].hidden[1])
    handle.remove()
    again = encoder.extract(texts, layers="all")
    for ours, theirs in zip(again, plain, strict=True):
        np.testing.assert_array_equal(ours.hidden, theirs.hidden)
