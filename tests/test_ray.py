"""Ray: sharded stores read as one; the CLI on Ray equals a single process, also after an actor
dies mid-shard; lw.ray.embed equals Encoder().embed. Ray runs in a network namespace with only
loopback (tests/ray_checks.py), so it can listen on no other address."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ud_sentences

import layerwise as lw
from layerwise.store._sharded import ShardedStore

HERE = Path(__file__).resolve().parent


def _sharded_by_hand(encoder, texts, path, shard_size, plan):
    """A sharded store written without Ray (the table and shard writer lw.ray uses)."""
    from test_sharded_store import write_sharded

    write_sharded(encoder, path, texts=texts, plan=plan, shard_size=shard_size)


def test_sharded_store_reads_as_one(tmp_path, tiny_encoder):
    texts = [f"text number {i} about a bank" + " and a river" * (i % 5) for i in range(23)]
    plan = lw.OutputPlan.parse(layers="0,-1", dtype="float16")
    _sharded_by_hand(tiny_encoder, texts, tmp_path / "s.lw", 10, plan)
    whole = tmp_path / "whole.lw"
    lw.extract_to_store(tiny_encoder, texts, whole, plan)
    sharded, single = lw.open_store(tmp_path / "s.lw"), lw.open_store(whole)
    assert isinstance(sharded, ShardedStore) and sharded.n_shards == 3
    assert len(sharded) == 23 and sharded.complete and sharded.text_ids() == list(range(23))
    for i in (0, 9, 10, 19, 20, 22):
        a, b = sharded[i], single[i]
        assert a.text == texts[i] and a.tokens == b.tokens
        np.testing.assert_array_equal(a.hidden, b.hidden)
    assert [r.text for r in sharded] == texts  # input order
    # rows lie shard after shard, each shard in its own commit order
    parts = [lw.open_store(tmp_path / "s.lw" / f"shard-0000{k}.lw") for k in range(3)]
    for layer in (0, -1):
        joined = np.concatenate([np.asarray(p.array(layer)) for p in parts])
        np.testing.assert_array_equal(np.asarray(sharded.array(layer)), joined)
        np.testing.assert_array_equal(sharded.array(layer)[5:300], joined[5:300])  # across shard boundaries
    assert len(sharded.array(-1)) == sharded.n_rows == single.n_rows
    assert sorted(sharded.manifest["text_id"].to_pylist()) == list(range(23))  # global ids, commit order
    assert sharded.verify().ok and lw.verify_store(tmp_path / "s.lw").ok
    with pytest.raises(KeyError, match=r"holds ids 0\.\.22"):
        sharded[23]
    shutil.rmtree(tmp_path / "s.lw" / "shard-00001.lw")  # a shard not written yet
    partial = lw.open_store(tmp_path / "s.lw")
    assert len(partial) == 13 and not partial.complete and 12 not in partial
    assert partial.pending_shards() == [1]
    # a writer killed after taking the shard's lock but before creating its store: still pending
    (tmp_path / "s.lw" / "shard-00001.lw").mkdir()
    (tmp_path / "s.lw" / "shard-00001.lw" / ".lock").touch()
    partial = lw.open_store(tmp_path / "s.lw")
    assert len(partial) == 13 and partial.pending_shards() == [1]
    report = partial.verify()
    assert not report.ok and "shard-00001.lw (texts 10..19) has not been written" in str(report)


def _netns_available() -> str | None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is not installed"
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        why = probe.stderr.strip() or "unshare -n failed"
        return f"cannot create a network namespace here ({why}); CI runs as root"
    return None


@pytest.mark.slow
@pytest.mark.xdist_group("exclusive")  # one Ray at a time under pytest-xdist (test_docs_examples.py)
def test_ray_runs_equal_single_process(tmp_path, default_encoder, decoder_folder, decoder_encoder):
    pytest.importorskip("ray")
    reason = _netns_available()
    if reason:
        pytest.skip(reason)
    texts = ud_sentences("dev", 500)
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    decoder = decoder_folder("llama")
    script = f"ip link set lo up && {sys.executable} {HERE / 'ray_checks.py'} {source} {tmp_path} {decoder}"
    run = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["cli_returncode"] == 0

    # 1. the CLI on Ray equals the single-process store, text for text
    reference = lw.extract_to_store(default_encoder, texts, tmp_path / "single.lw").path
    ray_store, single = lw.open_store(tmp_path / "cli.lw"), lw.open_store(reference)
    assert ray_store.n_shards == 4 and len(ray_store) == len(single) == 500
    for (i, got), (j, want) in zip(ray_store.items(), single.items(), strict=True):
        assert i == j and got.tokens == want.tokens
        np.testing.assert_array_equal(got.offsets, want.offsets)
        np.testing.assert_allclose(
            got.hidden, want.hidden, atol=2e-2, rtol=2e-3
        )  # fp16 rounding of one batch vs another

    # 1a. what the sharded store says of itself: its source and the max length its shards resolved;
    # and a run that cut texts said so, with the run's numbers (#55, 9)
    meta = lw.read_meta(tmp_path / "cli.lw")
    assert meta["source"] == str(source) and meta["max_length"] == default_encoder.max_length == 256
    assert lw.read_meta(tmp_path / "cut.lw")["max_length"] == 8
    assert report["cut_truncated"] > 10
    assert any(f"{report['cut_truncated']} of 40 texts were longer" in m for m in report["cut_warnings"])

    # 1b. the driver was killed mid-run; the rerun finished only what was missing, with equal results
    assert report["resume_returncode"] == 0 and report["shards_before_resume"] >= 1
    resumed = lw.open_store(tmp_path / "resume.lw")
    assert resumed.complete and resumed.verify().ok
    for (_, got), (_, want) in zip(resumed.items(), ray_store.items(), strict=True):
        assert got.tokens == want.tokens
        np.testing.assert_array_equal(got.hidden, want.hidden)  # same shards, same batches: identical

    # 2. an actor died in its first shard: Ray restarted it, the shard resumed, nothing differs
    assert report["killed_marker"]
    killed = lw.open_store(tmp_path / "killed.lw")
    assert killed.complete and killed.verify().ok
    words = default_encoder.embed_words(texts, subword="mean", layers=[0, -1])
    for i, result in killed.items():
        assert result.words == words[i].words
        np.testing.assert_allclose(result.vectors, words[i].vectors, atol=2e-2, rtol=2e-3)

    # 2b. a Parquet corpus with ids (and --limit): the sharded store keeps the ids, in order
    assert report["parquet_n_texts"] == 300
    from_parquet = lw.open_store(tmp_path / "parquet.lw")
    assert from_parquet.complete and from_parquet.n_shards == 3
    assert from_parquet.manifest.sort_by("text_id")["id"].to_pylist() == [f"d{i}" for i in range(300)]
    np.testing.assert_allclose(
        np.stack([from_parquet[i][-1] for i in range(300)]),
        default_encoder.embed(texts[:300], layers=-1, pool="mean"),
        atol=2e-3,
        rtol=2e-3,
    )  # float16 store

    # 3. lw.ray.embed equals Encoder().embed
    got = np.load(tmp_path / "embed.npy")
    want = default_encoder.embed(report["embed_texts"], pool="mean", fuse="concat_last4")
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert sorted(report["embed_texts"]) == sorted(texts[:200])

    # 3b. a decoder LM on Ray: the middle layer's last-token vectors, as one process gives them
    got = np.load(tmp_path / "decoder.npy")
    want = decoder_encoder("llama").embed(report["decoder_texts"], layers="0.5", pool="last")
    np.testing.assert_allclose(got, want, atol=1e-5)

    # 3c. the settings travel to real Ray actors: bfloat16, max_length and final_norm as one process
    got = np.load(tmp_path / "decoder_settings.npy")
    texts_c = report["decoder_settings_texts"]
    chosen = lw.Encoder(decoder, device="cpu", model_dtype="bfloat16", max_length=12, final_norm="all")
    np.testing.assert_allclose(got, chosen.embed(texts_c, layers="0.5", pool="last"), atol=1e-5)
    plain = decoder_encoder("llama").embed(texts_c, layers="0.5", pool="last")
    assert np.abs(got - plain).max() > 1e-2  # each setting moves these vectors: a dropped one shows

    # 4. the activation cache written by two actors equals one process's, context for context
    import datasets
    from ray_checks import CACHE_OPTIONS

    assert report["cache_written"] == report["cache_shards"] > 2
    single_cache = lw.cache_activations(default_encoder, source, tmp_path / "cache-one", CACHE_OPTIONS)
    assert single_cache.n_shards == report["cache_shards"] and lw.verify_cache(tmp_path / "cache-ray").ok
    on_ray = datasets.load_from_disk(str(tmp_path / "cache-ray")).with_format("numpy")
    one = datasets.load_from_disk(str(tmp_path / "cache-one")).with_format("numpy")
    assert (
        on_ray.column_names
        == one.column_names
        == ["blocks.2.hook_resid_post", "blocks.5.hook_resid_post", "token_ids"]
    )
    np.testing.assert_array_equal(on_ray["token_ids"], one["token_ids"])
    for name in on_ray.column_names[:2]:
        np.testing.assert_allclose(on_ray[name], one[name], atol=2e-3, rtol=2e-3)  # float16, other threads


def test_ray_options_are_checked_before_ray_starts(tmp_path):
    from typer.testing import CliRunner

    from layerwise.cli import app

    source = tmp_path / "t.txt"
    source.write_text("a\n", encoding="utf-8")
    result = CliRunner().invoke(
        app, ["extract", str(source), "-o", str(tmp_path / "o.npz"), "--ray", "local"]
    )
    assert result.exit_code == 2 and "--ray writes a sharded store" in result.output


def test_ray_store_never_writes_into_a_foreign_path(tmp_path, make_tiny_model):
    pytest.importorskip("ray")
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.txt").write_text("keep me", encoding="utf-8")
    (tmp_path / "file.lw").write_text("a file", encoding="utf-8")
    for target in (mine, tmp_path / "file.lw"):
        with pytest.raises(lw.OptionError, match="exists and is not a sharded layerwise store"):
            lw.ray.extract_to_store(lw.Settings(str(make_tiny_model("bert"))), ["a", "b"], target)
    assert (mine / "thesis.txt").read_text(encoding="utf-8") == "keep me" and sorted(mine.iterdir()) == [
        mine / "thesis.txt"
    ]
