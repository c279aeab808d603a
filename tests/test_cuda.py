"""The CUDA path: what layerwise computes on a GPU equals transformers' own forward on the same GPU
(float32, TF32 off), and the store and the activation cache write from it what an in-memory GPU
extract returns. Skipped on a machine without CUDA (CI has none); run them on one with
``python -m pytest -q tests/test_cuda.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import corpus

import layerwise as lw
from layerwise._model.forward.hooks import tap_module
from layerwise.errors import NonFiniteError

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

TEXTS = [*corpus(40, seed=3), " ".join(corpus(12, seed=5))]  # mixed lengths, one long text
# What one float32 forward differs by on the GPU when the batch's shape changes (cuBLAS picks other
# kernels and reduction orders for other shapes): TF32 is off, so this is float32 rounding only.
ATOL = RTOL = 1e-5
DEVICE = "cuda"


@pytest.fixture(autouse=True)
def exact_float32():
    """float32 matmuls and convolutions in full float32 (torch's default on most builds; stated here
    so that a TF32 default elsewhere cannot loosen the comparisons)."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _reference_states(model, ids: list[int]) -> np.ndarray:
    """transformers' hidden states of one text alone (no padding), on the model's own device."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=model.device), output_hidden_states=True)
    return torch.stack(out.hidden_states)[:, 0].float().cpu().numpy()


@pytest.mark.parametrize(("packed", "batch_size"), [(True, 128), (True, 3), (False, 128)])
def test_encoder_on_cuda_equals_transformers_on_cuda(make_tiny_model, packed, batch_size):
    # batch_size=3: 14 batches, each launched before the one before it is read (host_copy.py)
    enc = lw.Encoder(make_tiny_model("bert", 4), device=DEVICE, packed=packed, batch_size=batch_size)
    assert enc.device.type == "cuda" and next(enc.model.parameters()).is_cuda
    assert enc.engine.runs_packed("hidden_states", ()) is packed
    stacks = enc.extract(TEXTS, layers="all")
    for item, stack in zip(enc.tokenize(TEXTS), stacks, strict=True):
        want = _reference_states(enc.model, item.ids)
        np.testing.assert_allclose(stack.hidden, want, atol=ATOL, rtol=RTOL)
    on_cpu = lw.Encoder(make_tiny_model("bert", 4), device="cpu").extract(TEXTS, layers="all")
    for gpu, cpu in zip(stacks, on_cpu, strict=True):
        np.testing.assert_allclose(gpu.hidden, cpu.hidden, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
def test_decoder_on_cuda_equals_transformers_on_cuda(decoder_folder, arch):
    enc = lw.Encoder(decoder_folder(arch), device=DEVICE, final_norm=True)
    assert enc.engine.runs_packed("hidden_states", ())
    texts = [s for s in TEXTS if s][:20]
    stacks = enc.extract(texts, layers="all")
    for item, stack in zip(enc.tokenize(texts), stacks, strict=True):
        np.testing.assert_allclose(stack.hidden, _reference_states(enc.model, item.ids), atol=ATOL, rtol=RTOL)


def test_decoder_taps_on_cuda_equal_hooks_on_transformers_modules(decoder_folder):
    enc = lw.Encoder(decoder_folder("llama"), device=DEVICE, final_norm=False)
    taps = ("attn_out", "mlp_out")
    assert enc.engine.runs_packed("hidden_states", taps)
    texts = TEXTS[:10]
    stacks = enc.extract(texts, layers=[0, 1, 2], taps=list(taps))
    model = enc.model
    for item, stack in zip(enc.tokenize(texts), stacks, strict=True):
        recorded: dict = {}
        handles = [
            tap_module(model.layers[i], model.config.model_type, tap).register_forward_hook(
                lambda m, a, out, key=(tap, i), recorded=recorded: recorded.__setitem__(
                    key, (out[0] if isinstance(out, tuple) else out)[0].float().cpu().numpy()
                )
            )
            for tap in taps
            for i in (0, 1)
        ]
        try:
            with torch.no_grad():
                model(input_ids=torch.tensor([item.ids], device=DEVICE))
        finally:
            for handle in handles:
                handle.remove()
        for j, i in enumerate((0, 1)):
            for tap in taps:
                np.testing.assert_allclose(stack.taps[tap][j], recorded[(tap, i)], atol=ATOL, rtol=RTOL)


def test_store_from_cuda_holds_what_extract_returns(tmp_path, make_tiny_model):
    enc = lw.Encoder(make_tiny_model("bert", 4), device=DEVICE)
    path = tmp_path / "gpu.lw"
    summary = lw.extract_to_store(enc, TEXTS, path, lw.OutputPlan.parse(layers="all", dtype="float32"))
    assert summary.n_written == len(TEXTS)
    store = lw.open_store(path)
    assert store.complete and store.verify().ok
    for i, stack in enumerate(enc.extract(TEXTS, layers="all")):
        np.testing.assert_array_equal(store[i].hidden, stack.hidden)  # the same forward, stored as is


def test_cache_from_cuda_equals_transformers_on_the_stored_token_ids(tmp_path, decoder_folder):
    enc = lw.Encoder(decoder_folder("llama"), device=DEVICE)
    path = tmp_path / "acts"
    documents = [" ".join(TEXTS[k : k + 4]) for k in range(0, 40, 4)]
    summary = lw.cache_activations(
        enc,
        documents,
        path,
        lw.CacheOptions(
            layers="1,3", context=16, tokens=16 * 20, dtype="float32", hooks=("resid", "attn_out", "mlp_out")
        ),
    )
    assert summary.n_contexts == 20 and lw.verify_cache(path).ok
    datasets = pytest.importorskip("datasets")  # the cache extra
    ds = datasets.load_from_disk(str(path)).with_format("torch")
    rows = ds[0:20]
    model, recorded = enc.model, {}

    def keep(key):
        return lambda m, a, out: recorded.__setitem__(key, out[0] if isinstance(out, tuple) else out)

    handles = [model.layers[2].register_forward_hook(keep("blocks.2.hook_resid_post"))]  # the raw stream
    handles += [
        tap_module(model.layers[i], "llama", tap).register_forward_hook(keep(f"blocks.{i}.hook_{tap}"))
        for tap in ("attn_out", "mlp_out")
        for i in (0, 2)  # the blocks behind hidden states 1 and 3
    ]
    try:
        with torch.no_grad():
            ids = rows["token_ids"].long().to(DEVICE)
            states = model(input_ids=ids, output_hidden_states=True).hidden_states
    finally:
        for handle in handles:
            handle.remove()
    want = {"blocks.0.hook_resid_post": states[1], **recorded}
    assert sorted(ds.column_names) == sorted([*want, "token_ids"])
    for name, tensor in want.items():
        np.testing.assert_allclose(rows[name].numpy(), tensor.float().cpu().numpy(), atol=ATOL, rtol=RTOL)


def test_nan_on_cuda_names_the_input_and_allow_nan_keeps_it(make_tiny_model):
    enc = lw.Encoder(make_tiny_model("bert", 4), device=DEVICE, batch_size=3)
    enc.extract(TEXTS[:2])  # the packed forward now runs on the model's own modules
    with torch.no_grad():
        enc.model.encoder.layer[1].output.dense.bias[0] = float("nan")
    with pytest.raises(NonFiniteError, match="at hidden state 2") as raised:
        enc.extract(TEXTS, layers="all")
    # on a GPU the first block holds one batch of inputs (the device starts at once), longest first
    first_block = [len(item) for item in enc.tokenize(TEXTS[: enc.batch_size])]
    assert raised.value.index == max(range(len(first_block)), key=lambda i: (first_block[i], -i))
    kept = lw.Encoder(make_tiny_model("bert", 4), device=DEVICE, batch_size=3, allow_nan=True)
    kept.extract(TEXTS[:2])
    with torch.no_grad():
        kept.model.encoder.layer[1].output.dense.bias[0] = float("nan")
    stacks = kept.extract(TEXTS, layers="all")
    assert all(np.isnan(s.hidden[2:]).any() and np.isfinite(s.hidden[:2]).all() for s in stacks)


@pytest.mark.parametrize("model_dtype", ["float16", "bfloat16"])
def test_half_precision_on_cuda_is_close_to_float32(make_tiny_model, model_dtype):
    folder = make_tiny_model("bert", 4)
    exact = lw.Encoder(folder, device=DEVICE).extract(TEXTS, layers="all")
    half = lw.Encoder(folder, device=DEVICE, model_dtype=model_dtype).extract(TEXTS, layers="all")
    tolerance = {"float16": 1e-2, "bfloat16": 5e-2}[model_dtype]  # 10 and 7 mantissa bits, 4 layers
    for h, e in zip(half, exact, strict=True):
        assert h.hidden.dtype == np.float32 and np.isfinite(h.hidden).all()
        np.testing.assert_allclose(h.hidden, e.hidden, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("pool", ["cls", "mean", "max", "last"])
def test_sentence_pools_on_cuda_equal_the_cpu(make_tiny_model, pool):
    """Sentence plans pool on the GPU (features/device_pool.py): only (L, B, H) crosses; the numbers
    equal the CPU's, where the same torch code runs, for both special-token choices."""
    on_gpu = lw.Encoder(make_tiny_model("bert", 4), device=DEVICE, batch_size=5)
    on_cpu = lw.Encoder(make_tiny_model("bert", 4), device="cpu")
    for special_tokens in ("include", "exclude"):
        got = on_gpu.embed(TEXTS, layers="all", pool=pool, special_tokens=special_tokens)
        want = on_cpu.embed(TEXTS, layers="all", pool=pool, special_tokens=special_tokens)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_float16_results_on_cuda_cross_as_float16(make_tiny_model):
    """extract(dtype="float16") on the GPU: cast there, copied as float16, no float32 on the host."""
    on_gpu = lw.Encoder(make_tiny_model("bert", 4), device=DEVICE)
    on_cpu = lw.Encoder(make_tiny_model("bert", 4), device="cpu")
    for got, want in zip(on_gpu.extract(TEXTS, dtype="float16"), on_cpu.extract(TEXTS), strict=True):
        assert got.hidden.dtype == np.float16
        np.testing.assert_allclose(got.hidden.astype(np.float32), want.hidden, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("fuse", ["concat_last4", "mean_all", "sum_last4"])
def test_fused_and_normalised_sentences_and_words_on_cuda_equal_the_cpu(make_tiny_model, fuse):
    """The plan's fusion and normalisation run on the GPU too (device_pool.finish)."""
    on_gpu = lw.Encoder(make_tiny_model("bert", 4), device=DEVICE, batch_size=5)
    on_cpu = lw.Encoder(make_tiny_model("bert", 4), device="cpu")
    got = on_gpu.embed(TEXTS, fuse=fuse, normalize=True)
    np.testing.assert_allclose(got, on_cpu.embed(TEXTS, fuse=fuse, normalize=True), atol=1e-4, rtol=1e-4)
    for g, w in zip(on_gpu.embed_words(TEXTS, fuse=fuse), on_cpu.embed_words(TEXTS, fuse=fuse), strict=True):
        assert g.words == w.words
        np.testing.assert_allclose(g.vectors, w.vectors, atol=1e-4, rtol=1e-4)


def test_an_encoder_on_cuda_warms_the_device_once_when_made(make_tiny_model, monkeypatch):
    from layerwise._encoder import core

    calls = []
    real = core.warm_device
    monkeypatch.setattr(core, "warm_device", lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
    enc = lw.Encoder(make_tiny_model("bert", 4), device=DEVICE)
    assert len(calls) == 1 and calls[0] > 0
    assert enc.extract(["warm"])[0].hidden.shape[0] == enc.n_hidden_states


def test_cli_on_cuda_writes_what_it_writes_on_the_cpu(tmp_path, make_tiny_model):
    """`layerwise extract` to Parquet (every layer, sentence mean) and to a store exported back out,
    with --device cuda and --device cpu: the same vectors to 1e-4."""
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from layerwise.cli import app

    model, source = make_tiny_model("bert", 4), tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")

    def vectors(path, columns):
        table = pq.read_table(path)
        return np.stack([np.stack(table.column(c).to_numpy(zero_copy_only=False)) for c in columns])

    written = {}
    for device in ("cpu", DEVICE):
        on = ["--model", str(model), "--device", device, "-q"]
        pooled, store, exported = (
            tmp_path / f"{device}{suffix}" for suffix in (".parquet", ".lw", "_x.parquet")
        )
        for args in (
            ["extract", str(source), "-o", str(pooled), "--pool", "sentence:mean", *on],
            ["extract", str(source), "-o", str(store), "--dtype", "float32", *on],
            ["export", str(store), "-o", str(exported), "--layers", "-1", "-q"],
        ):
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 0, result.output
        written[device] = (vectors(pooled, [f"layer_{i}" for i in range(5)]), vectors(exported, ["layer_4"]))
    for cpu, gpu in zip(written["cpu"], written[DEVICE], strict=True):
        assert cpu.shape == gpu.shape and cpu.shape[1] == len(TEXTS)
        np.testing.assert_allclose(gpu, cpu, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_streamed_on_cuda_equals_in_memory_on_cuda(make_tiny_model, decoder_folder, arch):
    """Layer-streamed on the GPU (each layer's weights assigned on the device for one block; the
    unpooled states leave it as each layer is computed) equals the in-memory GPU forward."""
    folder = make_tiny_model("bert", 4) if arch == "bert" else decoder_folder("llama")
    texts = [s for s in TEXTS if s][:20]
    memory = lw.Encoder(folder, device=DEVICE)
    streamed = lw.Encoder(folder, device=DEVICE, streaming=True, stream_block_tokens=200)
    for a, b in zip(streamed.extract(texts, layers="all"), memory.extract(texts, layers="all"), strict=True):
        np.testing.assert_allclose(a.hidden, b.hidden, atol=ATOL, rtol=RTOL)
    pooled = {"layers": "all", "pool": "mean"}
    np.testing.assert_allclose(
        streamed.embed(texts, **pooled), memory.embed(texts, **pooled), atol=ATOL, rtol=RTOL
    )
    assert streamed.engine.streamed.model.peak_resident <= 2


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_a_residual_stream_in_pinned_host_memory_on_cuda_equals_in_memory(
    make_tiny_model, decoder_folder, arch
):
    """The block's residual stream waits in pinned host memory between layers, each batch copied in
    and out on a stream of its own while the previous one computes: the in-memory numbers."""
    import dataclasses

    from layerwise._engine.engine import Engine

    folder = make_tiny_model("bert", 4) if arch == "bert" else decoder_folder("llama")
    texts = [s for s in TEXTS if s][:40]
    memory = lw.Encoder(folder, device=DEVICE, max_length=32)
    streamed = lw.Encoder(folder, device=DEVICE, streaming=True, max_length=32, max_tokens=48,
                          stream_block_tokens=2000)  # fmt: skip
    plan = dataclasses.replace(streamed.engine.streamed.plan, residual="host")  # as a tight GPU budget
    streamed.engine = Engine(streamed.models, streamed.tokenizer, streamed.engine.settings, plan)
    for a, b in zip(streamed.extract(texts, layers="all"), memory.extract(texts, layers="all"), strict=True):
        np.testing.assert_allclose(a.hidden, b.hidden, atol=ATOL, rtol=RTOL)
    pooled = {"layers": "all", "pool": "mean"}
    np.testing.assert_allclose(
        streamed.embed(texts, **pooled), memory.embed(texts, **pooled), atol=ATOL, rtol=RTOL
    )
    assert streamed.run_meta(lw.OutputPlan())["stream_residual"] == "host"


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_a_device_map_with_half_the_layers_on_the_cpu_equals_the_gpu_alone(
    make_tiny_model, decoder_folder, arch
):
    """Each layer on its own device (accelerate's hooks move the residual stream between the GPU and
    the CPU): every hidden state as on the GPU alone, none of them the zeros of a failed copy."""
    folder = make_tiny_model("bert", 4) if arch == "bert" else decoder_folder("llama")
    memory = lw.Encoder(folder, device=DEVICE)
    prefix, first, last = (
        ("encoder.layer.", ["embeddings"], ["pooler"])
        if arch == "bert"
        else ("layers.", ["embed_tokens", "rotary_emb"], ["norm"])
    )
    n = memory.n_layers
    device_map = {**dict.fromkeys(first, 0), **{f"{prefix}{i}": 0 if i < n // 2 else "cpu" for i in range(n)},
                  **dict.fromkeys(last, "cpu")}  # fmt: skip
    placed = lw.Encoder(folder, device_map=device_map)
    assert placed.device.type == "cuda" and set(placed.model.hf_device_map.values()) == {0, "cpu"}
    texts = [s for s in TEXTS if s][:20]
    for a, b in zip(placed.extract(texts, layers="all"), memory.extract(texts, layers="all"), strict=True):
        np.testing.assert_allclose(a.hidden, b.hidden, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("bits", ["8bit", "4bit"])
def test_quantised_weights_run_on_cuda(decoder_folder, bits):
    """8- and 4-bit weights (bitsandbytes): every layer close to the float16 model's, the last one
    within what rounding the weights to so few bits allows."""
    pytest.importorskip("bitsandbytes")
    folder = decoder_folder("llama")
    full = lw.Encoder(folder, device=DEVICE, model_dtype="float16")
    quantised = lw.Encoder(folder, device=DEVICE, model_dtype="float16", quantize=bits)
    assert quantised.model.is_quantized and quantised.engine.settings.packed is False
    texts = [s for s in TEXTS if s][:8]
    for a, b in zip(quantised.extract(texts, layers="all"), full.extract(texts, layers="all"), strict=True):
        assert np.isfinite(a.hidden).all()
        cosine = (a.hidden * b.hidden).sum(-1) / (
            np.linalg.norm(a.hidden, axis=-1) * np.linalg.norm(b.hidden, axis=-1)
        )
        assert cosine.min() > (0.9 if bits == "8bit" else 0.7)
