"""The store: round trips, crash safety (SIGKILL + resume), locking, disk errors, plain-zarr reading."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_close_fp16, corpus, ud_sentences

import layerwise as lw
from layerwise.errors import StoreError
from layerwise.store._commit import Committer as _Committer
from layerwise.store._lock import writer_lock


def test_token_store_round_trip(tmp_path, tiny):
    texts = [*corpus(40), "", "Is it raining?"]
    summary = lw.extract_to_store(
        tiny, texts, tmp_path / "c.lw", layout=lw.StoreLayout(block_size=16, chunk_rows=8, shard_chunks=2)
    )
    assert (summary.n_texts, summary.n_written, summary.resumed) == (42, 42, False)
    store = lw.open_store(tmp_path / "c.lw")
    assert len(store) == 42 and store.complete and store.layers == (0, 1, 2, 3)
    assert (
        store.model == str(tiny.name)
        and store.meta["dtype"] == "float16"
        and store.meta["layer_0"] == "embedding output"
    )
    expected = tiny.extract(texts)
    for i, exact in enumerate(expected):
        got = store[i]
        assert isinstance(got, lw.LayerStack)
        assert got.tokens == exact.tokens and got.text == texts[i]
        np.testing.assert_array_equal(got.offsets, exact.offsets)
        np.testing.assert_array_equal(got.word_ids, exact.word_ids)
        assert_close_fp16(got.hidden, exact.hidden)
    assert [s.text for s in store] == texts  # iteration streams in input order
    last = store.array(-1)
    assert last.shape == (sum(s.n_tokens for s in expected), 32)
    start, stop = store.rows(5)
    np.testing.assert_array_equal(last[start:stop], store[5].layer(3))
    assert np.concatenate(list(last.iter_chunks(50))).shape == last.shape
    with pytest.raises(KeyError, match="text 99 is not in the store: 42 of 42 texts are committed"):
        store[99]


def test_pooled_stores_round_trip(tmp_path, tiny):
    texts = corpus(30, seed=1)
    lw.extract_to_store(
        tiny,
        texts,
        tmp_path / "w.lw",
        lw.OutputPlan.parse(dtype="float16", pool="word:mean"),
        layout=lw.StoreLayout(chunk_rows=8, shard_chunks=2),
    )
    words = lw.open_store(tmp_path / "w.lw")
    expected = tiny.embed_words(texts, subword="mean")
    for i in range(len(texts)):
        assert words[i].words == expected[i].words
        assert_close_fp16(words[i].vectors, expected[i].vectors)
    lw.extract_to_store(
        tiny,
        texts,
        tmp_path / "s.lw",
        lw.OutputPlan.parse(pool="sentence:cls", fuse="concat_last4", dtype="float32"),
    )
    sentences = lw.open_store(tmp_path / "s.lw")
    np.testing.assert_array_equal(
        np.stack([sentences[i] for i in range(30)]), tiny.embed(texts, pool="cls", fuse="concat_last4")
    )
    assert sentences.array(None).shape == (30, 4 * 32)


def test_pairs_and_windows_in_store(tmp_path, make_tiny_model):
    enc = lw.Encoder(make_tiny_model("bert"), device="cpu", max_length=16)
    firsts, seconds = ["q one", "q two"], ["a " * 30, "short"]
    lw.extract_to_store(
        enc,
        lw.Corpus.from_inputs(firsts, text_pairs=seconds),
        tmp_path / "p.lw",
        lw.OutputPlan.parse(dtype="float16", long_texts="window", stride=4),
    )
    store = lw.open_store(tmp_path / "p.lw")
    exact = enc.extract(firsts, text_pairs=seconds, long_texts="window", stride=4)
    assert store[0].n_windows == exact[0].n_windows > 1 and store[0].text_pair == seconds[0]
    assert_close_fp16(store[0].hidden, exact[0].hidden)


def test_readable_with_zarr_and_pyarrow_alone(tmp_path, tiny):
    """Follow the README's recipe: no layerwise needed to read a store."""
    texts = corpus(20, seed=2)
    lw.extract_to_store(tiny, texts, tmp_path / "c.lw", layout=lw.StoreLayout(chunk_rows=8, shard_chunks=2))
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import zarr

    root = zarr.open_group(str(tmp_path / "c.lw"), mode="r")
    meta = root.attrs["layerwise"]
    offsets = root["offsets"][:]
    n = int(np.argmax(offsets < 0)) - 1 if (offsets < 0).any() else len(offsets) - 1
    manifest = pq.read_table(tmp_path / "c.lw" / "manifest")
    manifest = manifest.filter(pc.less(manifest["position"], n)).sort_by("position")
    row = manifest.filter(pc.equal(manifest["text_id"], 7)).to_pylist()[0]
    hidden = root["data"][offsets[row["position"]] : offsets[row["position"] + 1]]  # (tokens, layers, hidden)
    assert meta["layers"] == [0, 1, 2, 3] and hidden.shape == (len(row["tokens"]), 4, 32)
    exact = tiny.extract([texts[7]])[0]
    assert row["tokens"] == list(exact.tokens)
    assert_close_fp16(hidden.transpose(1, 0, 2).astype(np.float32), exact.hidden)


def test_second_writer_is_refused(tmp_path, tiny):
    path = tmp_path / "c.lw"
    path.mkdir()
    with writer_lock(path), pytest.raises(StoreError, match="is being written by another process"):
        lw.extract_to_store(tiny, corpus(5), path)


def test_changed_settings_or_input_are_refused(tmp_path, tiny):
    texts = corpus(10)
    lw.extract_to_store(tiny, texts, tmp_path / "c.lw")
    with pytest.raises(StoreError, match=r"other settings \(layers: stored \[0, 1, 2, 3\], now \[3\]"):
        lw.extract_to_store(tiny, texts, tmp_path / "c.lw", lw.OutputPlan.parse(dtype="float16", layers=-1))
    changed = [*texts[:3], "something else", *texts[4:]]
    with pytest.raises(StoreError, match=r"text 3 \(input line 4\) differs"):
        lw.extract_to_store(tiny, changed, tmp_path / "c.lw")
    again = lw.extract_to_store(tiny, changed, tmp_path / "c.lw", overwrite=True)
    assert again.n_written == 10 and lw.open_store(tmp_path / "c.lw")[3].text == "something else"


def test_disk_full_keeps_committed_texts_and_resumes(tmp_path, tiny, monkeypatch):
    texts = corpus(60, seed=3)
    original = _Committer.commit
    calls = {"n": 0}

    def failing(self, *args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, *args)

    monkeypatch.setattr(_Committer, "commit", failing)
    path = tmp_path / "c.lw"
    with pytest.raises(StoreError, match=r"the disk is full\. \d+ of 60 texts are committed and readable"):
        lw.extract_to_store(
            tiny, texts, path, layout=lw.StoreLayout(block_size=16, chunk_rows=8, shard_chunks=2)
        )
    partial = lw.open_store(path)
    assert 0 < len(partial) < 60
    exact = tiny.extract(texts)
    for i in partial.text_ids():
        assert_close_fp16(partial[i].hidden, exact[i].hidden)
    monkeypatch.setattr(_Committer, "commit", original)
    resumed = lw.extract_to_store(
        tiny, texts, path, layout=lw.StoreLayout(block_size=16, chunk_rows=8, shard_chunks=2)
    )
    assert resumed.resumed and resumed.n_already_committed + resumed.n_written == 60
    store = lw.open_store(path)
    assert store.complete and sorted(store.manifest["text_id"].to_pylist()) == list(range(60))


def test_a_failed_write_leaves_no_partial_file(tmp_path, tiny, monkeypatch):
    """The disk fills while a shard file or manifest part is being written: its temp file goes too."""
    from layerwise.store import _commit as commit

    texts = corpus(60, seed=3)
    real_replace = commit.os.replace

    def full(source, target):  # the store's rows and manifest parts; its metadata is written first
        if f"data{os.sep}c{os.sep}" in str(target) or f"{os.sep}manifest{os.sep}" in str(target):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(source, target)

    monkeypatch.setattr(commit.os, "replace", full)
    path = tmp_path / "c.lw"
    with pytest.raises(StoreError, match="the disk is full"):
        lw.extract_to_store(
            tiny, texts, path, layout=lw.StoreLayout(block_size=16, chunk_rows=8, shard_chunks=2)
        )
    assert not [p for p in path.rglob("*") if p.name.endswith(".partial")]
    monkeypatch.setattr(commit.os, "replace", real_replace)
    assert (
        lw.extract_to_store(
            tiny, texts, path, layout=lw.StoreLayout(block_size=16, chunk_rows=8, shard_chunks=2)
        ).n_written
        == 60
    )


def test_unwritable_path(tmp_path, tiny):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot create store"):
        lw.extract_to_store(tiny, corpus(3), blocker / "c.lw")
    with pytest.raises(StoreError, match="exists and is a file"):
        lw.extract_to_store(tiny, corpus(3), blocker)


# ---------------------------------------------------------------------------- kill and resume
def _command(model: Path, source: Path, out: Path) -> list[str]:
    layout = ["--chunk-rows", "64", "--shard-chunks", "4", "--block-size", "300"]
    command = [sys.executable, "-m", "layerwise.cli", "extract", str(source), "-o", str(out)]
    return [*command, "--model", str(model), "-q", *layout]


def _committed(path: Path) -> int:
    try:
        return len(lw.open_store(path))
    except Exception:  # not created yet
        return 0


def _same_store(a: Path, b: Path) -> None:
    import zarr

    za, zb = zarr.open_group(str(a), mode="r"), zarr.open_group(str(b), mode="r")
    np.testing.assert_array_equal(za["offsets"][:], zb["offsets"][:])
    np.testing.assert_array_equal(za["data"][:], zb["data"][:])
    ma, mb = lw.open_store(a).manifest, lw.open_store(b).manifest
    assert ma.to_pylist() == mb.to_pylist()


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_equals_uninterrupted(tmp_path, make_tiny_model):
    model = make_tiny_model("bert")
    texts = corpus(2500, seed=4)
    source = tmp_path / "corpus.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    reference = tmp_path / "reference.lw"  # uninterrupted, in-process: the same plan as the command line
    layout = lw.StoreLayout(chunk_rows=64, shard_chunks=4, block_size=300)
    lw.extract_to_store(lw.Encoder(model, device="cpu"), texts, reference, layout=layout, source=str(source))

    target = tmp_path / "killed.lw"
    rng = random.Random(7)
    kills, seen = 0, {}
    for _attempt in range(6):
        process = subprocess.Popen(_command(model, source, target), env=env)
        deadline = time.time() + 120
        before = _committed(target)
        while process.poll() is None and _committed(target) <= before and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0, 0.4))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()
            kills += 1
        # a reader sees only whole texts, and they never change afterwards
        store = lw.open_store(target) if (target / "zarr.json").exists() else None
        if store is not None:
            for text_id in store.text_ids()[-5:]:
                item = store[text_id]
                assert item.hidden.shape[1] == len(item.tokens) and np.isfinite(item.hidden).all()
                seen[text_id] = item.hidden
        if process.returncode == 0:
            break
        if kills >= 2:
            break
    assert kills >= 2, "the run finished before it could be killed; make the corpus larger"
    subprocess.run(_command(model, source, target), check=True, env=env, timeout=300)
    final = lw.open_store(target)
    assert final.complete and sorted(final.manifest["text_id"].to_pylist()) == list(range(len(texts)))
    _same_store(target, reference)
    for text_id, hidden in seen.items():
        np.testing.assert_array_equal(final[text_id].hidden, hidden)
    assert not list(target.rglob("*.partial"))


def test_cli_store_reports_resume_and_completion(tmp_path, make_tiny_model):
    from typer.testing import CliRunner

    from layerwise.cli import app

    source = tmp_path / "t.txt"
    source.write_text("\n".join(corpus(12)) + "\n", encoding="utf-8")
    out = tmp_path / "c.lw"
    runner = CliRunner()
    first = runner.invoke(
        app, ["extract", str(source), "-o", str(out), "--model", str(make_tiny_model("bert"))]
    )
    assert first.exit_code == 0, first.output
    assert "stored 12 texts" in " ".join(first.output.split())
    again = runner.invoke(
        app, ["extract", str(source), "-o", str(out), "--model", str(make_tiny_model("bert"))]
    )
    assert again.exit_code == 0 and "is complete: 12 texts" in " ".join(again.output.split())
    meta = json.loads(json.dumps(lw.open_store(out).meta))
    assert (
        meta["format"] == "layerwise-store"
        and meta["format_version"] == 1
        and len(meta["weights_sha256"]) == 64
    )


def test_truncation_is_reported_once_per_store_run(tmp_path, make_tiny_model, caplog):
    import logging

    enc = lw.Encoder(make_tiny_model("bert"), device="cpu", max_length=16)
    long_text = " ".join(["word"] * 40)
    texts = [long_text, "short", "short too", long_text]  # the long ones fall in different blocks
    with caplog.at_level(logging.WARNING, logger="layerwise"):
        lw.extract_to_store(enc, texts, tmp_path / "c.lw", layout=lw.StoreLayout(block_size=2))
    notes = [r.getMessage() for r in caplog.records if "longer than" in r.getMessage()]
    assert notes == [
        "2 of 4 texts were longer than 16 tokens and were truncated; the manifest's 'truncated' column marks "
        "them. Pass long_texts='window' to keep every token."
    ]
    manifest = lw.open_store(tmp_path / "c.lw").manifest
    flags = dict(zip(manifest["text_id"].to_pylist(), manifest["truncated"].to_pylist(), strict=True))
    assert flags == {0: True, 1: False, 2: False, 3: True}


@pytest.mark.parametrize(
    "options",
    [{}, {"pool": "word:mean"}, {"pool": "sentence:mean", "fuse": "concat_last4"}, {"pairs": True}],
)
def test_manifest_table_is_the_same_as_from_pylist(tiny, tmp_path, options):
    """The writer builds manifest parts column by column (records_table): the same table, value for
    value and type for type, as pyarrow's row-wise from_pylist, for every level and with pairs."""
    import pyarrow as pa

    from layerwise.store._commit import records_table

    texts = [*ud_sentences("dev", 30), "", "a"]
    pairs = [t[::-1] for t in texts] if options.pop("pairs", False) else None
    plan = lw.OutputPlan.parse(dtype="float16", **options)
    lw.extract_to_store(tiny, lw.Corpus.from_inputs(texts, text_pairs=pairs), tmp_path / "m.lw", plan)
    records = lw.open_store(tmp_path / "m.lw").manifest.to_pylist()
    fast, slow = records_table(records), pa.Table.from_pylist(records)
    assert fast.schema == slow.schema and fast.equals(slow)


@pytest.mark.parametrize(
    "options", [{}, {"fuse": "concat_last4", "pool": "sentence:mean"}, {"dtype": "float32"}]
)
def test_direct_shard_files_are_the_bytes_zarr_writes(tiny, tmp_path, monkeypatch, options):
    """Whole shards are written as files directly (commit.ShardFiles); every file of the store must be
    byte for byte what zarr's own sharding codec writes, and read back through plain zarr."""
    import zarr

    from layerwise.store import _commit as commit

    texts = corpus(120, seed=3)
    plan, layout = (
        lw.OutputPlan.parse(**{"dtype": "float16", **options}),
        lw.StoreLayout(chunk_rows=8, shard_chunks=4),
    )
    lw.extract_to_store(tiny, texts, tmp_path / "direct.lw", plan, layout=layout)
    monkeypatch.setattr(commit.ShardFiles, "for_array", classmethod(lambda cls, folder: None))
    lw.extract_to_store(tiny, texts, tmp_path / "zarr.lw", plan, layout=layout)
    direct = sorted(
        p.relative_to(tmp_path / "direct.lw") for p in (tmp_path / "direct.lw" / "data").rglob("*")
    )
    written = sorted(p.relative_to(tmp_path / "zarr.lw") for p in (tmp_path / "zarr.lw" / "data").rglob("*"))
    assert direct == written and len(direct) > 4
    for name in direct:
        a, b = tmp_path / "direct.lw" / name, tmp_path / "zarr.lw" / name
        if a.is_file():
            assert a.read_bytes() == b.read_bytes(), name
    plain = zarr.open_array(str(tmp_path / "direct.lw" / "data"), mode="r")
    np.testing.assert_array_equal(plain[:], zarr.open_array(str(tmp_path / "zarr.lw" / "data"), mode="r")[:])
    assert lw.open_store(tmp_path / "direct.lw").verify().ok


def test_manifest_columns_match_from_pylist_for_every_value_kind():
    """Columns built from buffers (store/columns.py): nulls among strings, ints, floats and bools,
    non-ASCII text, empty lists, all-null and mixed-type columns — the same as from_pylist."""
    import pyarrow as pa

    from layerwise.store._columns import records_table

    records = [
        {"s": "Zürich 東京", "i": -3, "f": 0.5, "b": True, "n": None, "m": 1, "l": ["a", "bé"], "e": []},
        {"s": None, "i": None, "f": None, "b": None, "n": None, "m": 2.5, "l": [], "e": []},
        {"s": "", "i": 2**62, "f": -1e300, "b": False, "n": None, "m": 3, "l": ["", "c"], "e": []},
    ]
    fast, slow = records_table(records), pa.Table.from_pylist(records)
    assert fast.schema == slow.schema and fast.equals(slow)
    assert fast.to_pylist() == records


def test_writing_a_store_does_not_import_pandas(tmp_path, make_tiny_model):
    """pyarrow imports pandas on its first pa.array or dataset read: 0.14 s of the CLI's start-up."""
    import subprocess
    import sys

    folder = make_tiny_model("bert", 2)
    code = (
        "import sys, layerwise as lw\n"
        f"enc = lw.Encoder({str(folder)!r}, device='cpu')\n"
        f"lw.extract_to_store(enc, ['a text', 'another one'], {str(tmp_path / 's.lw')!r})\n"
        "print('pandas' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    assert len(lw.open_store(tmp_path / "s.lw")) == 2  # (reading may import it: to_numpy does)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_stored_rows_cast_equals_numpy_bit_for_bit(dtype, monkeypatch):
    """The writer's torch-backed cast (store/rows.py) gives NumPy's numbers to the bit: rounding to
    nearest even, float16 subnormals, overflow to inf, signed zeros, NaN."""
    import torch  # noqa: F401  (loaded, as whenever a store is written: the fast path)

    from layerwise.store._rows import stored_rows

    rng = np.random.default_rng(0)
    hidden = (rng.standard_normal((7, 33, 24)) * 10.0 ** rng.integers(-9, 6, (7, 33, 24))).astype(np.float32)
    special = [0.0, -0.0, 65504.0, 65519.99, 65520.0, -1e6, 6e-8, 3e-8, 2.98e-8, 1.0 + 2**-11, np.inf, np.nan]
    hidden[0, 0, : len(special)] = special
    view = hidden.transpose(1, 0, 2)  # the writer's token-major view
    with np.errstate(over="ignore"):  # NumPy warns of the overflow to inf that both do
        want = np.ascontiguousarray(view, dtype=dtype)
    monkeypatch.setattr(np, "ascontiguousarray", None)  # the torch path, not NumPy's
    got = stored_rows(view, dtype)
    monkeypatch.undo()
    assert got.flags.c_contiguous and got.dtype == want.dtype and got.shape == want.shape
    bits = np.uint16 if dtype == "float16" else np.uint32
    assert ((got.view(bits) == want.view(bits)) | (np.isnan(got) & np.isnan(want))).all()
    assert stored_rows(want, dtype) is want  # already stored form: nothing to do


def test_a_store_rewritten_under_a_reader_says_so(tmp_path, tiny):
    """Another process runs --overwrite while a reader has the store open: the reader is told that
    the store is being rewritten, never a KeyError; once the writer is gone, damage is damage."""
    from layerwise.store._format import remove_store_entries
    from layerwise.store._lock import writer_lock

    path = tmp_path / "c.lw"
    lw.extract_to_store(tiny, corpus(5), str(path))
    assert lw.verify_store(str(path)).ok  # a str is a path wherever a path is taken
    reader = lw.open_store(str(path))
    with writer_lock(path):  # what `layerwise extract ... --overwrite` holds while it starts again
        remove_store_entries(path)
        with pytest.raises(StoreError, match=r"being rewritten by another process \(pid \d+\)"):
            reader[0]
        with pytest.raises(StoreError, match="being rewritten by another process"):
            lw.open_store(path)
    with pytest.raises(StoreError) as caught:
        reader[0]
    assert "being rewritten" not in str(caught.value)


def test_rows_rewritten_under_a_reader_are_not_called_damage(tmp_path, tiny):
    """#46, 16: a read during --overwrite that found the new rows said "rows of text 1 differ from
    the checksum" instead of "being rewritten"."""
    from layerwise.store._lock import writer_lock

    path = tmp_path / "c.lw"
    lw.extract_to_store(tiny, corpus(5), path, lw.OutputPlan(dtype="float32"))
    reader = lw.open_store(path)
    shard = next(p for p in (path / "data").rglob("*") if p.is_file() and p.name != "zarr.json")
    original = shard.read_bytes()
    changed = bytearray(original)
    changed[len(changed) // 2] ^= 0xFF  # the writer has replaced rows under the reader
    shard.write_bytes(bytes(changed))
    with writer_lock(path), pytest.raises(StoreError, match="being rewritten by another process"):
        reader.read_many(list(range(5)))
    with pytest.raises(lw.StoreDamagedError, match="differ from the checksum"):  # no writer: damage
        reader.read_many(list(range(5)))
