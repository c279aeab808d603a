"""The activation cache: what datasets.load_from_disk reads equals transformers' own hidden states
on the stored token ids; the order is a seeded permutation over the whole run; a killed run resumes
to the same bytes; settings, second writers and foreign folders are refused; verify finds damage."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from conftest import corpus, needs_smollm2

import layerwise as lw
from layerwise._cache.format import read_meta
from layerwise.errors import LayerSpecError, NotAStoreError, OptionError, StoreError

_SENTENCES = corpus(180, seed=11)
TEXTS = [" ".join(_SENTENCES[k : k + 3]) + f" doc{k}" for k in range(0, 180, 3)]  # 60 documents


def _shard_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("data-*.arrow"))}


def _source_contexts(enc, context: int, texts=TEXTS) -> np.ndarray:
    """The contexts cut independently, as docs/formats.md says: an encoder's window is [CLS] body
    [SEP] and documents are joined by [SEP]; a decoder that starts with BOS has BOS body, documents
    joined by BOS; any other decoder the bare body, documents joined by EOS."""
    tok = enc.tokenizer
    if not enc.is_decoder:
        begin, end, separator = [tok.cls_token_id], [tok.sep_token_id], [tok.sep_token_id]
    elif tok.bos_token_id is not None and tok("a")["input_ids"][:1] == [tok.bos_token_id]:
        begin, end, separator = [tok.bos_token_id], [], [tok.bos_token_id]
    else:
        begin, end, separator = [], [], [tok.eos_token_id]
    stream: list[int] = []
    for k, text in enumerate(texts):
        stream += (separator if k else []) + tok(text, add_special_tokens=False)["input_ids"]
    body = context - len(begin) - len(end)
    rows, start = [], 0
    while True:
        if begin and begin == separator and stream[start : start + 1] == separator:
            start += 1  # a window that would open with the separator after BOS skips it
        if len(stream) - start < body:
            break
        rows.append(begin + stream[start : start + body] + end)
        start += body
    return np.asarray(rows, dtype=np.int32)


def test_cached_activations_equal_transformers_on_the_stored_token_ids(tmp_path, tiny):
    path = tmp_path / "acts"
    options = lw.CacheOptions(layers="all", context=24, tokens=24 * 30, dtype="float32", shard_bytes=40_000)
    summary = lw.cache_activations(tiny, TEXTS, path, options)
    assert summary.n_contexts == 30 and summary.n_shards > 2
    ds = datasets.load_from_disk(str(path)).with_format("torch")
    names = ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(3)]
    assert ds.column_names == [*names, "token_ids"] and len(ds) == 30
    features = ds.features
    assert features[names[1]].shape == (24, 32) and features[names[1]].dtype == "float32"
    assert features["token_ids"].length == 24 and features["token_ids"].feature.dtype == "int32"
    rows = ds[0:30]
    with torch.no_grad():
        want = tiny.model(input_ids=rows["token_ids"].long(), output_hidden_states=True).hidden_states
    for i, name in enumerate(names):
        np.testing.assert_allclose(rows[name].numpy(), want[i].numpy(), atol=1e-5, rtol=1e-5)
    assert lw.verify_cache(path).ok


@pytest.mark.parametrize("final_norm", [False, True])
def test_decoder_cache_is_the_residual_stream_or_the_final_norm(tmp_path, decoder_encoder, final_norm):
    enc = decoder_encoder("llama")
    path = tmp_path / "acts"
    lw.cache_activations(
        enc,
        TEXTS,
        path,
        lw.CacheOptions(layers="0,2,3", context=16, tokens=16 * 12, dtype="float32", final_norm=final_norm),
    )
    ds = datasets.load_from_disk(str(path)).with_format("numpy")
    last = "ln_final.hook_normalized" if final_norm else "blocks.2.hook_resid_post"
    assert ds.column_names == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_post", last, "token_ids"]
    model = enc.model
    outputs: list[torch.Tensor] = []
    hook = model.layers[2].register_forward_hook(
        lambda m, a, out: outputs.append(out[0] if isinstance(out, tuple) else out)
    )
    try:
        with torch.no_grad():
            states = model(
                input_ids=torch.as_tensor(ds["token_ids"]).long(), output_hidden_states=True
            ).hidden_states
    finally:
        hook.remove()
    np.testing.assert_allclose(ds["blocks.0.hook_resid_pre"], states[0].numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(ds["blocks.1.hook_resid_post"], states[2].numpy(), atol=1e-5, rtol=1e-5)
    want = states[3] if final_norm else outputs[0]  # transformers' last state carries the final norm
    np.testing.assert_allclose(ds[last], want.numpy(), atol=1e-5, rtol=1e-5)


def test_contexts_are_a_seeded_permutation_of_the_whole_run(tmp_path, tiny):
    path = tmp_path / "acts"
    lw.cache_activations(
        tiny,
        TEXTS,
        path,
        lw.CacheOptions(layers=-1, context=16, tokens=16 * 80, shuffle_seed=7, shard_bytes=20_000),
    )
    stored = np.asarray(datasets.load_from_disk(str(path)).with_format("numpy")["token_ids"], dtype=np.int32)
    source = _source_contexts(tiny, 16)[:80]
    index = {row.tobytes(): k for k, row in enumerate(source)}
    assert len(index) == 80  # every source context is distinct: positions identify them
    order = np.asarray([index[row.tobytes()] for row in stored])
    assert sorted(order) == list(range(80))  # every context exactly once
    np.testing.assert_array_equal(order, np.random.default_rng(7).permutation(80))
    first_shard = order[: read_meta(path)["shard_contexts"]]
    assert first_shard.max() - first_shard.min() > 40  # a contiguous read mixes the whole corpus
    unshuffled = tmp_path / "plain"
    lw.cache_activations(
        tiny, TEXTS, unshuffled, lw.CacheOptions(layers=-1, context=16, tokens=16 * 80, shuffle_seed=None)
    )
    plain = np.asarray(
        datasets.load_from_disk(str(unshuffled)).with_format("numpy")["token_ids"], dtype=np.int32
    )
    np.testing.assert_array_equal(plain, source)


RUN = """
import sys, layerwise as lw
sys.path.insert(0, {tests!r})
from test_cache import TEXTS
enc = lw.Encoder({model!r}, device="cpu")
lw.cache_activations(enc, TEXTS, {path!r}, lw.CacheOptions(layers="all", context=16, tokens=16 * 100,
                     shuffle_seed=3, shard_bytes=6_000), progress=False)
"""


def test_a_killed_run_resumes_to_the_same_bytes(tmp_path, tiny):
    """SIGKILL once some shards are written, rerun: every shard equals an uninterrupted run's."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    tests = str(Path(__file__).parent)
    run = lambda path: [sys.executable, "-c", RUN.format(tests=tests, model=str(tiny.source), path=str(path))]  # noqa: E731
    subprocess.run(run(whole), check=True)
    n_shards = read_meta(whole)["n_shards"]
    process = subprocess.Popen(run(killed))
    deadline = time.time() + 120
    while len(list(killed.glob("data-*.arrow"))) < 2 and time.time() < deadline and process.poll() is None:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    written = len(list(killed.glob("data-*.arrow")))
    assert 0 < written < n_shards, "the kill came too late to test a resume"
    assert not (killed / "state.json").exists()
    subprocess.run(run(killed), check=True)
    assert _shard_bytes(killed) == _shard_bytes(whole) and len(_shard_bytes(whole)) == n_shards
    assert not list(killed.glob(".*.partial"))
    assert lw.verify_cache(killed).ok


def test_a_failed_shard_write_raises_and_the_rerun_completes_it(tmp_path, tiny, monkeypatch):
    """Shards are written on a thread while the next one is computed: a write that fails (a full
    disk) still stops the run with its own error, leaves no temp file, and the rerun fills the gap."""
    import layerwise._cache.writer as cache_writer

    options = lw.CacheOptions(layers="all", context=16, tokens=16 * 40, shuffle_seed=3, shard_bytes=6_000)
    lw.cache_activations(tiny, TEXTS, tmp_path / "whole", options)
    real, calls = cache_writer.write_shard, []

    def full_disk(path, name, *args):
        calls.append(name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(path, name, *args)

    monkeypatch.setattr(cache_writer, "write_shard", full_disk)
    with pytest.raises(
        lw.StoreError,
        match=r"writing cache .*acts' failed: the disk is full\. 2 of \d+ shards are "
        r"written and kept; fix the cause and run the same command again to resume",
    ):
        lw.cache_activations(tiny, TEXTS, tmp_path / "acts", options)
    assert len(list((tmp_path / "acts").glob("data-*.arrow"))) == 2 and len(calls) == 3  # none after it
    assert not (tmp_path / "acts" / "state.json").exists()  # not complete: load_from_disk refuses it
    monkeypatch.setattr(cache_writer, "write_shard", real)
    lw.cache_activations(tiny, TEXTS, tmp_path / "acts", options)
    assert _shard_bytes(tmp_path / "acts") == _shard_bytes(tmp_path / "whole")
    assert not list((tmp_path / "acts").glob(".*.partial")) and lw.verify_cache(tmp_path / "acts").ok


def test_resume_refuses_other_settings_and_a_second_writer(tmp_path, tiny):
    from layerwise.store._lock import writer_lock

    path = tmp_path / "acts"
    lw.cache_activations(tiny, TEXTS, path, lw.CacheOptions(layers="0,2", context=16, tokens=16 * 10))
    with pytest.raises(StoreError, match=r"other settings \(layers: cached \[0, 2\], now \[0, 3\]\)"):
        lw.cache_activations(tiny, TEXTS, path, lw.CacheOptions(layers="0,3", context=16, tokens=16 * 10))
    with pytest.raises(StoreError, match="context: cached 16, now 20"):
        lw.cache_activations(tiny, TEXTS, path, lw.CacheOptions(layers="0,2", context=20, tokens=16 * 10))
    with pytest.raises(StoreError, match="made from other texts"):
        lw.cache_activations(
            tiny, TEXTS[::-1], path, lw.CacheOptions(layers="0,2", context=16, tokens=16 * 10)
        )
    with writer_lock(path), pytest.raises(StoreError, match="being written by another process"):
        lw.cache_activations(tiny, TEXTS, path, lw.CacheOptions(layers="0,2", context=16, tokens=16 * 10))
    before = _shard_bytes(path)
    summary = lw.cache_activations(
        tiny, TEXTS, path, lw.CacheOptions(layers="0,2", context=16, tokens=16 * 10)
    )
    assert summary.n_written == 0 and _shard_bytes(path) == before  # complete: nothing to do


def test_overwrite_removes_only_what_the_cache_owns(tmp_path, tiny):
    path = tmp_path / "acts"
    lw.cache_activations(tiny, TEXTS, path, lw.CacheOptions(layers="0,2", context=16, tokens=16 * 10))
    (path / "notes.txt").write_text("mine")
    lw.cache_activations(
        tiny, TEXTS, path, lw.CacheOptions(layers="1", context=16, tokens=16 * 10, overwrite=True)
    )
    assert (path / "notes.txt").read_text() == "mine"
    assert datasets.load_from_disk(str(path)).column_names == ["blocks.0.hook_resid_post", "token_ids"]


def test_bad_input_writes_nothing(tmp_path, tiny):
    path = tmp_path / "acts"
    cases = [
        (LayerSpecError, "layer 9 out of range", {"layers": 9}),
        (OptionError, "context=600 is longer than this model takes", {"context": 600}),
        (OptionError, "tokens=10 is less than one context of 16 tokens", {"tokens": 10}),
        (OptionError, "dtype='bfloat16' is not one the cache stores", {"dtype": "bfloat16"}),
    ]
    for error, message, bad in cases:
        options = {"layers": -1, "context": 16, "tokens": 160, **bad}
        with pytest.raises(error, match=message):
            lw.cache_activations(tiny, TEXTS, path, lw.CacheOptions(**options))
        assert not path.exists()
    other = tmp_path / "mine"
    other.mkdir()
    (other / "data.csv").write_text("a,b\n")
    with pytest.raises(NotAStoreError, match="is a folder that is not a layerwise activation cache"):
        lw.cache_activations(tiny, TEXTS, other, lw.CacheOptions(context=16, tokens=160))
    assert os.listdir(other) == ["data.csv"]


def test_cli_cache_and_verify(tmp_path, tiny):
    from typer.testing import CliRunner

    from layerwise.cli import app

    source = tmp_path / "corpus.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "acts"
    runner = CliRunner()
    args = ["cache", str(source), "-o", str(out), "--model", str(tiny.source), "--layers", "0.5,-1"]
    result = runner.invoke(app, [*args, "--context", "16", "--tokens", "0.4K", "-q"])
    assert result.exit_code == 0, result.output
    ds = datasets.load_from_disk(str(out))
    assert len(ds) == 25 and ds.column_names == [
        "blocks.1.hook_resid_post",
        "blocks.2.hook_resid_post",
        "token_ids",
    ]
    verified = runner.invoke(app, ["verify", str(out)])
    assert verified.exit_code == 0 and "OK: 25 contexts, 400 tokens" in verified.output
    bad = runner.invoke(app, [*args, "--context", "16", "--tokens", "8"])
    assert bad.exit_code == 2 and "tokens=8 is less than one context" in bad.output
    shard = sorted(out.glob("data-*.arrow"))[-1]
    raw = bytearray(shard.read_bytes())
    raw[-200:-190] = b"\x00" * 10  # token ids or activations of the last rows
    shard.write_bytes(bytes(raw))
    damaged = runner.invoke(app, ["verify", str(out)])
    assert damaged.exit_code == 1 and "DAMAGED" in damaged.output


@needs_smollm2
def test_smollm2_cache_equals_transformers(tmp_path, smollm2):
    path = tmp_path / "acts"
    lw.cache_activations(
        smollm2,
        TEXTS[:20],
        path,
        lw.CacheOptions(layers="0.25,0.5,0.75", context=32, tokens=32 * 4, dtype="float32"),
    )
    ds = datasets.load_from_disk(str(path)).with_format("numpy")
    assert ds.column_names[:3] == [
        "blocks.7.hook_resid_post",
        "blocks.14.hook_resid_post",
        "blocks.22.hook_resid_post",
    ]
    with torch.no_grad():
        states = smollm2.model(
            input_ids=torch.as_tensor(ds["token_ids"]).long(), output_hidden_states=True
        ).hidden_states
    for name, i in zip(ds.column_names[:3], (8, 15, 23), strict=True):
        want = states[i].numpy()
        # two float32 GEMM kernels (oneDNN's prepacked linears on an AMD processor, transformers'
        # F.linear) round apart by a few units of the state's own scale: SmolLM2's residual stream
        # holds values near 2e4 beside ones near 1e-2
        np.testing.assert_allclose(
            ds[name], want, rtol=1e-4, atol=max(1e-4, 1e-6 * float(np.abs(want).max()))
        )


def test_sae_lens_trains_from_the_cache(tmp_path, default_encoder):
    """SAELens' own cached-activations path (ActivationsStore(cached_activations_path=...)) reads
    the cache, and its trainer fits an SAE from it: reconstruction error falls."""
    pytest.importorskip("sae_lens")
    from sae_lens import SAETrainer, StandardTrainingSAE, StandardTrainingSAEConfig
    from sae_lens.config import LoggingConfig, SAETrainerConfig
    from sae_lens.training.activations_store import ActivationsStore

    path = tmp_path / "acts"
    lw.cache_activations(default_encoder, TEXTS, path, lw.CacheOptions(layers=3, context=32, tokens=32 * 64))
    store = ActivationsStore(
        model=None, dataset=None, streaming=False, hook_name="blocks.2.hook_resid_post", hook_head_index=None,
        context_size=32, d_in=384, n_batches_in_buffer=16, total_training_tokens=32 * 64,
        store_batch_size_prompts=8, train_batch_size_tokens=256, prepend_bos=False,
        normalize_activations="none",
        device=torch.device("cpu"), dtype="float32", cached_activations_path=str(path),
    )  # fmt: skip
    sae = StandardTrainingSAE(
        StandardTrainingSAEConfig(d_in=384, d_sae=768, l1_coefficient=1.0, device="cpu")
    )
    config = SAETrainerConfig(
        total_training_samples=256 * 20, train_batch_size_samples=256, lr_end=3e-5,
        n_batches_for_norm_estimate=10, logger=LoggingConfig(log_to_wandb=False),
    )  # fmt: skip
    batch = next(iter(store))
    assert batch.shape == (256, 384) and batch.dtype == torch.float32
    with torch.no_grad():
        before = float(((sae(batch) - batch) ** 2).mean())
    trainer = SAETrainer(cfg=config, sae=sae, data_provider=store)
    trainer.fit()
    with torch.no_grad():
        after = float(((sae(batch) - batch) ** 2).mean())
    assert trainer.n_training_steps == 20 and after < 0.6 * before


def test_cli_ray_gets_every_option(tmp_path, monkeypatch):
    """--ray passes the same options as a local run (checked without starting Ray: the real run is
    tests/test_ray.py's)."""
    from typer.testing import CliRunner

    import layerwise.ray as lw_ray
    from layerwise.cli import app

    calls: dict = {}
    monkeypatch.setattr(lw_ray, "init", lambda mode, **kw: calls.update(init=(mode, kw)))

    def fake(settings, corpus, path, options, *, workers, threads_per_worker):
        calls.update(settings=settings, corpus=corpus, path=path, options=options, workers=workers,
                     threads=threads_per_worker)  # fmt: skip
        raise lw.OptionError("stop here")

    monkeypatch.setattr(lw_ray, "cache_activations", fake)
    source = tmp_path / "c.csv"
    source.write_text("body\nsome text\n")
    args = ["cache", str(source), "-o", str(tmp_path / "acts"), "--ray", "local", "--workers", "3",
            "--threads-per-worker", "2", "--layers", "0.5", "--hooks", "mlp_out,resid", "--context", "64",
            "--tokens", "2M", "--dtype", "float32", "--shuffle-seed", "9", "--final-norm", "last",
            "--model-dtype", "bfloat16", "--text-column", "body", "--overwrite"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "stop here" in result.output
    assert calls["init"] == ("local", {"workers": 3, "threads_per_worker": 2})
    assert calls["settings"].model_dtype == "bfloat16" and (calls["workers"], calls["threads"]) == (3, 2)
    assert calls["corpus"].describe() == str(source) and calls["corpus"].reading["text_column"] == "body"
    assert calls["options"] == lw.CacheOptions(
        layers="0.5",
        hooks=("mlp_out", "resid"),
        context=64,
        tokens=2_000_000,
        dtype="float32",
        shuffle_seed=9,
        final_norm=True,
        overwrite=True,
    )


def test_attn_out_and_mlp_out_columns_equal_hooks_on_transformers(tmp_path, decoder_encoder):
    from layerwise._model.forward.hooks import tap_module

    enc = decoder_encoder("llama")
    path = tmp_path / "acts"
    lw.cache_activations(
        enc,
        TEXTS,
        path,
        lw.CacheOptions(
            layers="1,3", context=16, tokens=16 * 8, dtype="float32", hooks=("attn_out", "resid", "mlp_out")
        ),
    )
    ds = datasets.load_from_disk(str(path)).with_format("numpy")
    assert ds.column_names == [
        "blocks.0.hook_attn_out", "blocks.0.hook_resid_post", "blocks.0.hook_mlp_out",
        "blocks.2.hook_attn_out", "blocks.2.hook_resid_post", "blocks.2.hook_mlp_out", "token_ids",
    ]  # fmt: skip
    recorded: dict = {}

    def keep(key):
        def hook(module, args, out):
            recorded[key] = (out[0] if isinstance(out, tuple) else out).detach().numpy()

        return hook

    model = enc.model
    handles = [tap_module(model.layers[i], "llama", tap).register_forward_hook(keep(f"blocks.{i}.hook_{tap}"))
               for tap in ("attn_out", "mlp_out") for i in (0, 2)]  # fmt: skip
    try:
        with torch.no_grad():
            model(input_ids=torch.as_tensor(ds["token_ids"]).long())
    finally:
        for handle in handles:
            handle.remove()
    for name, want in recorded.items():
        np.testing.assert_allclose(ds[name], want, atol=1e-5, rtol=1e-5)
    with pytest.raises(OptionError, match=r"hidden state 0 .* has none"):
        lw.cache_activations(
            enc,
            TEXTS,
            tmp_path / "b",
            lw.CacheOptions(layers="0,1", context=16, tokens=160, hooks=("mlp_out",)),
        )


def test_a_corpus_shorter_than_the_tokens_asked_for_says_so(tmp_path, tiny):
    from typer.testing import CliRunner

    from layerwise.cli import app

    summary = lw.cache_activations(
        tiny, TEXTS[:5], tmp_path / "acts", lw.CacheOptions(context=16, tokens=10**6)
    )
    assert summary.exhausted and 0 < summary.n_contexts < 10**6 // 16
    assert len(datasets.load_from_disk(str(tmp_path / "acts"))) == summary.n_contexts
    source = tmp_path / "few.txt"
    source.write_text("\n".join(TEXTS[:5]) + "\n")
    args = ["cache", str(source), "-o", str(tmp_path / "cli"), "--model", str(tiny.source), "--context", "16"]
    result = CliRunner().invoke(app, [*args, "--tokens", "1M"])
    assert result.exit_code == 0 and f"the corpus ended after {summary.n_tokens:,} tokens" in result.output
    with pytest.raises(OptionError, match="fewer than 16 tokens"):
        lw.cache_activations(tiny, ["a b"], tmp_path / "tiny", lw.CacheOptions(context=16, tokens=160))
    assert not (tmp_path / "tiny").exists()  # a new cache that fails its token pass leaves nothing
