"""A streamed block's residual stream in host memory between layers (streaming/residual.py): the same
numbers as in memory, each batch's state copied out rather than aliased, and the block sizing that
chooses host memory on a GPU whose budget cannot hold the block's stream (streaming/plan.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import assert_same_stacks

import layerwise as lw
from layerwise._engine.engine import Engine
from layerwise._model.streaming.plan import DEFAULT_BLOCK_TOKENS, StreamPlan, plan_stream
from layerwise._model.streaming.residual import Residual
from layerwise.errors import OptionError

TEXTS = [
    "The bank raised rates.",
    "She sat on the river bank and watched the water for a long while.",
    "Layer by layer.",
    "A much longer sentence about nothing in particular, which goes on and on, so that it is cut.",
] * 3
# blocks of several batches: the next batch's state comes in while this one computes
SMALL_BATCHES = {"max_length": 32, "max_tokens": 40, "stream_block_tokens": 400}


def _on_host(enc: lw.Encoder) -> lw.Encoder:
    """``enc`` with its blocks' residual stream in host memory, as a GPU's tight budget chooses: its
    engine built again with that plan."""
    assert enc.engine.streamed is not None
    plan = dataclasses.replace(enc.engine.streamed.plan, residual="host")
    enc.engine = Engine(enc.models, enc.tokenizer, enc.engine.settings, plan)
    return enc


@pytest.mark.parametrize("arch", ["bert", "llama", "gemma3_text", "gpt2"])
def test_the_residual_stream_in_host_memory_gives_the_in_memory_numbers(
    make_tiny_model, decoder_folder, arch
):
    folder = make_tiny_model("bert", 3) if arch == "bert" else decoder_folder(arch)
    extra = {} if arch == "bert" else {"final_norm": "all"}
    memory = lw.Encoder(folder, device="cpu", max_length=32, **extra)
    streamed = _on_host(lw.Encoder(folder, device="cpu", streaming=True, **SMALL_BATCHES, **extra))
    assert_same_stacks(streamed.extract(TEXTS, layers="all"), memory.extract(TEXTS, layers="all"))
    subset = {"layers": [1, -1], "pool": "mean"}  # a subset: the last layer computed is not parked
    np.testing.assert_allclose(streamed.embed(TEXTS, **subset), memory.embed(TEXTS, **subset), atol=1e-5)
    assert streamed.engine.streamed.model.peak_resident <= 2
    assert streamed.run_meta(lw.OutputPlan())["stream_residual"] == "host"


def test_each_batch_waits_as_a_copy_its_input_is_let_go_and_the_last_layer_is_not_kept():
    """Parked states are copies (a step that reuses its output's memory cannot change them); each
    input is let go once its batch has run (the block holds one layer's states); after the last
    layer nothing is parked; ``after`` sees every output in order."""
    shared = torch.zeros(1, 3)

    def step(hidden: torch.Tensor, i: int) -> torch.Tensor:
        return shared.copy_(hidden + 1)  # every batch writes the same tensor

    for on_host in (True, False):
        residual = Residual(torch.device("cpu"), on_host=on_host)
        items = [(torch.full((1, 3), float(i)), i) for i in range(3)]
        seen: list[tuple[int, float]] = []

        def record(i: int, out: torch.Tensor, seen: list = seen) -> None:
            seen.append((i, float(out[0, 0])))

        parked = residual.run(step, items, record, last=False)
        assert seen == [(0, 1.0), (1, 2.0), (2, 3.0)]
        assert items == [(), (), ()]
        if on_host:
            assert [float(p[0, 0]) for p in parked] == [1.0, 2.0, 3.0]
        fresh = [(torch.zeros(1, 3), i) for i in range(3)]
        assert residual.run(step, fresh, lambda i, out: None, last=True) == []


def test_a_streamed_run_reports_where_its_residual_stream_waited(make_tiny_model):
    model = make_tiny_model("bert", 3)
    assert (
        lw.Encoder(model, device="cpu", streaming=True).run_meta(lw.OutputPlan())["stream_residual"]
        == "device"
    )
    assert lw.Encoder(model, device="cpu").run_meta(lw.OutputPlan())["stream_residual"] is None


@pytest.fixture
def llama(decoder_folder):
    """A streamed Llama: its config and the costs the block plan reads."""
    enc = lw.Encoder(decoder_folder("llama"), device="cpu", streaming=True)
    return enc.config, enc.models.streamed.shape()


def _on_gpu(settings: lw.Settings, shape, forwards: int = 1, host_free: int = 10**12, on_cuda: bool = True):
    """The plan of ``shape`` on a GPU (``on_cuda``) with texts of 64 tokens and batches of 100,000."""
    return plan_stream(
        settings,
        shape,
        on_cuda=on_cuda,
        host_free=host_free,
        max_length=64,
        max_tokens=100_000,
        forwards=forwards,
    )


def test_a_gpu_budget_short_of_the_block_puts_its_stream_in_host_memory(llama):
    config, shape = llama
    block = DEFAULT_BLOCK_TOKENS  # kept on the device for the block: its word-table rows, ids, rotary
    assert shape.held == 24 + 2 * config.head_dim * 4 and shape.vocab == config.vocab_size
    held = min(config.vocab_size, block) * shape.state + block * shape.held
    budget = shape.weights + held + 100 * (shape.work + 4 * shape.state)  # a device block: a few thousand
    settings = lw.Settings(max_device_memory=str(budget))
    assert _on_gpu(settings, shape, on_cuda=False).block_tokens < block  # what the device alone holds
    assert _on_gpu(settings, shape, forwards=2) == StreamPlan(block, 100, 1, "host")  # batch: in, out, work
    given = lw.Settings(max_device_memory=str(budget), stream_block_tokens=20_000)  # a given block too
    plan = _on_gpu(given, shape)
    assert (plan.block_tokens, plan.forwards, plan.residual) == (20_000, 1, "host")


def test_a_gpu_budget_that_holds_the_block_keeps_its_stream_on_the_device(llama):
    settings = lw.Settings(max_device_memory="1GB", stream_block_tokens=1000)
    plan = _on_gpu(settings, llama[1])
    assert (plan.block_tokens, plan.residual) == (1000, "device")


def test_host_memory_and_budgets_too_small_for_the_host_stream_are_refused_with_sizes(llama):
    shape = llama[1]
    budget = str(shape.weights + 4000 * shape.state + 64 * shape.work)  # a device block of ~1,800 tokens
    given = lw.Settings(max_device_memory=budget, stream_block_tokens=DEFAULT_BLOCK_TOKENS)
    with pytest.raises(
        OptionError, match=r"residual stream in host memory: two layers' weights take .* give at least"
    ):
        _on_gpu(given, shape)
    plan = _on_gpu(lw.Settings(max_device_memory=budget), shape)
    assert 1000 < plan.block_tokens < 2000 and plan.residual == "device"  # the default: what the device holds
    huge = lw.Settings(max_device_memory="1GB", stream_block_tokens=100 * DEFAULT_BLOCK_TOKENS)
    with pytest.raises(
        OptionError, match=r"stream_block_tokens=3,276,800: .* host memory .* at most 262,144"
    ):
        _on_gpu(huge, shape, host_free=10 * DEFAULT_BLOCK_TOKENS * shape.state)


def test_a_cpu_budget_never_moves_the_stream(make_tiny_model):
    enc = lw.Encoder(make_tiny_model("bert", 3), device="cpu", streaming=True, max_device_memory="300KB")
    plan = enc.engine.streamed.plan
    assert plan.residual == "device" and plan.block_tokens < DEFAULT_BLOCK_TOKENS


def test_a_streamed_forward_runs_the_plan_it_was_built_with_and_nothing_sets_it_after(make_tiny_model):
    """What a streamed forward runs with (its plan, the residual's place, the concurrent forwards) is
    fixed when it is built: setting any of them afterwards raises (so any code that did would fail
    every streamed test)."""
    enc = lw.Encoder(make_tiny_model("bert", 3), device="cpu", streaming=True, stream_block_tokens=64)
    forward = enc.engine.streamed
    assert forward.plan.block_tokens == 64 == enc.engine.settings.stream_block_tokens
    assert forward.residual.place == forward.plan.residual == "device"
    changed = dataclasses.replace(forward.plan, residual="host")
    for name, value in [("plan", changed), ("residual", Residual(enc.device, on_host=True)), ("pool", None)]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(forward, name, value)
    assert forward.plan.residual == "device" and not forward.residual.on_host


def test_the_concurrent_forwards_let_go_of_each_input_too(make_tiny_model):
    """On the CPU's concurrent forwards (two batches at once) a layer's inputs are let go as on the
    sequential path: the caller's items are emptied, the outputs are each input's step."""
    forward = lw.Encoder(
        make_tiny_model("bert", 3), device="cpu", streaming=True, concurrent_forwards=2
    ).engine.streamed
    assert forward.pool is not None
    items = [(torch.full((2, 3), float(i)),) for i in range(4)]
    seen: list[int] = []
    outputs = forward._each(lambda h: h * 2, items, lambda i, out: seen.append(i), last=False)
    assert items == [] and seen == [0, 1, 2, 3]
    assert [float(o[0, 0]) for o in outputs] == [0.0, 2.0, 4.0, 6.0]


def test_the_rotary_embeddings_a_block_keeps_are_counted_per_family(make_tiny_model, decoder_folder):
    kinds = {
        arch: lw.Encoder(decoder_folder(arch), device="cpu", streaming=True).models.streamed.rotary_kinds
        for arch in ("llama", "gemma3_text", "gpt2")
    }
    bert = lw.Encoder(make_tiny_model("bert", 3), device="cpu", streaming=True).models.streamed
    gemma3 = lw.Encoder(decoder_folder("gemma3_text"), device="cpu").config.layer_types  # its layers' kinds
    assert kinds == {"llama": 1, "gemma3_text": len(set(gemma3)), "gpt2": 0} and bert.rotary_kinds == 0
