"""Damage on disk never comes back as numbers (#55): every read of a store and of an activation
cache checks what it returns, ``verify`` finds damage in every file, and a damaged record is
DAMAGED (exit 1), not "another kind of folder" (exit 2)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import corpus
from typer.testing import CliRunner

import layerwise as lw
from layerwise.cli import app
from layerwise.errors import StoreDamagedError

LAYOUT = lw.StoreLayout(chunk_rows=8, shard_chunks=2, block_size=16)  # shards of 16 rows: many files


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_encoder) -> Path:
    path = tmp_path_factory.mktemp("damage") / "ref.lw"
    lw.extract_to_store(tiny_encoder, corpus(40, seed=2), path, lw.OutputPlan(dtype="float16"), layout=LAYOUT)
    return path


@pytest.fixture
def copy(reference, tmp_path) -> Path:
    target = tmp_path / "d.lw"
    shutil.copytree(reference, target)
    return target


def flip(file: Path, at: int, mask: int = 0xFF) -> None:
    data = bytearray(file.read_bytes())
    data[at] ^= mask
    file.write_bytes(bytes(data))


def shard(path: Path, k: int) -> Path:
    return path / "data" / "c" / str(k) / "0" / "0"


def parts(path: Path) -> list[Path]:
    return sorted((path / "manifest").glob("part-*.parquet"))


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


# ------------------------------------------------------------------------- 1. bulk reads
def test_swapped_data_shards_fail_array_and_iter_chunks(copy, reference):
    """#55, 1: array() and iter_chunks read the shards without checksums: swapped shards came back
    as other texts' values, and iter_chunks completed."""
    a, b = shard(copy, 5), shard(copy, 6)
    os.rename(a, a.with_name("t"))
    os.rename(b, a)
    os.rename(a.with_name("t"), b)
    store = lw.open_store(copy)
    with pytest.raises(StoreDamagedError, match="differ from the checksums written when they were committed"):
        store.array(-1)[80:96]
    with pytest.raises(StoreDamagedError):
        list(store.array(-1).iter_chunks(32))
    with pytest.raises(StoreDamagedError):
        store.array(0)[[90, 3]]
    with pytest.raises(StoreDamagedError):
        np.asarray(store.array(-1))
    assert not lw.verify_store(copy).ok
    # rows of texts far from the swapped shards still read, and equal the raw data
    clean = lw.open_store(reference)
    assert np.array_equal(store.array(-1)[0:16], clean.array(-1)[0:16])


def test_a_flipped_byte_in_a_data_shard_fails_a_bulk_read(copy):
    flip(shard(copy, 5), 40)
    with pytest.raises(StoreDamagedError, match="Texts affected"):
        lw.open_store(copy).array(-1)[80, 0]


def test_bulk_reads_equal_the_raw_rows_for_every_index(reference):
    """The checked view returns what zarr holds: slices, steps, ints, lists, masks, row and column."""
    store = lw.open_store(reference)
    raw = np.asarray(store.data[:])
    for layer, k in ((0, 0), (-1, raw.shape[1] - 1), (2, store.layers.index(2))):
        view = store.array(layer)
        assert view.shape == (store.n_rows, raw.shape[-1])
        assert np.array_equal(view[:], raw[:, k])
        assert np.array_equal(view[7:200:5], raw[7:200:5, k])
        assert np.array_equal(view[[300, 2, 2, 150]], raw[[300, 2, 2, 150], k])
        assert np.array_equal(view[-1], raw[-1, k]) and view[5, 3] == raw[5, k, 3]
        mask = np.zeros(store.n_rows, dtype=bool)
        mask[[1, 99]] = True
        assert np.array_equal(view[mask], raw[mask][:, k])
        assert np.array_equal(np.concatenate(list(view.iter_chunks(37))), raw[:, k])
        assert view[5:5].shape == (0, raw.shape[-1])


def test_sharded_store_bulk_reads_are_checked(tmp_path, tiny_encoder):
    from layerwise.store._shard_writer import begin_sharded_store, write_shard

    texts = corpus(30, seed=4)
    plan = lw.OutputPlan(dtype="float16")
    path = tmp_path / "s.lw"
    table = begin_sharded_store(
        path, model=tiny_encoder.name, plan=tiny_encoder.settle(plan),
        n_hidden_states=tiny_encoder.n_hidden_states, texts=texts, text_pairs=None, shard_size=15,
        overwrite=False,
    )  # fmt: skip
    for k in range(2):
        write_shard(tiny_encoder, path, table, k, texts[15 * k : 15 * (k + 1)], None, plan, layout=LAYOUT)
    assert len(np.asarray(lw.open_store(path).array(-1))) > 0
    flip(shard(path / "shard-00001.lw", 1), 30)
    with pytest.raises(StoreDamagedError):
        list(lw.open_store(path).array(-1).iter_chunks())


# ------------------------------------------------------------------------- 3. manifest parts
def test_a_flipped_byte_anywhere_in_a_manifest_part_is_damage(copy, reference):
    """#55, 3: of 150 flips of one part, 7 changed what reads return while verify said OK."""
    part = parts(copy)[2]
    original = part.read_bytes()
    clean = lw.open_store(reference)
    expected = [clean[i] for i in clean.text_ids()]
    for at in range(0, len(original), max(1, len(original) // 24)):
        flip(part, at, 0x01)
        assert not lw.verify_store(copy).ok, at
        store = None
        try:
            store = lw.open_store(copy)
            got = [store[i] for i in store.text_ids()]
        except StoreDamagedError:
            got = None
        assert got is None, f"a flip at byte {at} of {part.name} was read back"
        part.write_bytes(original)
    assert lw.verify_store(copy).ok and len(expected) == 40


@pytest.mark.parametrize("column", ["text", "tokens", "id", "char_start", "truncated", "text_sha1"])
def test_a_part_rewritten_with_pyarrow_is_damage(copy, column):
    """#55, 3: a part rewritten with pyarrow, one column edited, passed verify; export then wrote the
    edited text (text_sha1 was never checked against the text)."""
    part = parts(copy)[1]
    table = pq.read_table(part)
    values = table[column].to_pylist()
    edits = {
        "text": lambda v: "EDITED",
        "tokens": lambda v: ["[CLS]"],
        "id": lambda v: 999,
        "char_start": lambda v: [9] * len(v),
        "truncated": lambda v: not v,
        "text_sha1": lambda v: "0" * 40,
    }
    values[0] = edits[column](values[0])  # fmt: skip
    table = table.set_column(table.column_names.index(column), column, pa.array(values, table[column].type))
    pq.write_table(table, part)
    report = lw.verify_store(copy)
    assert not report.ok and "differs from the checksum in its name" in str(report)
    with pytest.raises(StoreDamagedError, match=part.name):
        lw.open_store(copy)[:]
    exported = cli("export", copy, "-o", copy.parent / "e.parquet", "--pool", "sentence:mean")
    assert exported.exit_code == 1 and "DAMAGED" in exported.output and part.name in exported.output


def test_text_sha1_is_checked_against_the_text_even_when_the_checksum_is_forged(copy):
    """A part edited and renamed to its new checksum (a careful forger): the text's own hash says."""
    import zlib

    part = parts(copy)[1]
    table = pq.read_table(part)
    texts = table["text"].to_pylist()
    texts[0] = "EDITED"
    table = table.set_column(table.column_names.index("text"), "text", pa.array(texts))
    pq.write_table(table, part)
    first = part.name.split("-")[1]
    part.rename(part.with_name(f"part-{first}-{zlib.crc32(part.read_bytes()):08x}.parquet"))
    store = lw.open_store(copy)
    edited = int(table["text_id"][0].as_py())
    with pytest.raises(StoreDamagedError, match=f"the text of text {edited} differs from its text_sha1"):
        store[edited]
    report = lw.verify_store(copy)
    assert "1 texts differ from their text_sha1" in str(report) and report.text_ids == [edited]


@pytest.mark.parametrize("damage", ["truncated", "not parquet"])
def test_an_unreadable_part_is_damage_named(copy, damage):
    """#55, 12: a damaged part gave OSError (thrift) or ArrowInvalid (magic bytes) tracebacks."""
    part = parts(copy)[0]
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"PAR1" + bytes(len(data) - 4))
    with pytest.raises(StoreDamagedError, match=part.name):
        lw.open_store(copy)[:]
    for command in (("export", copy, "-o", copy.parent / "e.parquet"), ("verify", copy)):
        result = cli(*command)
        assert result.exit_code == 1 and "DAMAGED" in result.output and part.name in result.output


def test_stores_of_0_2_whose_parts_carry_no_checksum_still_read(copy, reference):
    for part in parts(copy):
        first = part.name.split("-")[1]
        part.rename(part.with_name(f"part-{first}.parquet"))
    store, clean = lw.open_store(copy), lw.open_store(reference)
    assert np.array_equal(store[3].hidden, clean[3].hidden) and store.verify().ok


# ------------------------------------------------------------------------- 4. positions
def _positions_chunk(path: Path) -> Path:
    return next(p for p in (path / "positions").rglob("*") if p.is_file() and p.name != "zarr.json")


@pytest.mark.parametrize("at", [5, 20, 60, -5])
def test_a_flipped_byte_in_positions_is_damage(copy, at):
    """#55, 4: every damage to positions/ passed verify; reads then said "text 84 is not in the
    store: 200 of 200 texts are committed", or raised zstd's RuntimeError."""
    chunk = _positions_chunk(copy)
    flip(chunk, at if at >= 0 else chunk.stat().st_size + at)
    report = lw.verify_store(copy)
    assert not report.ok and "positions/" in str(report)
    try:
        lw.open_store(copy)[:]
    except StoreDamagedError as exc:
        assert "positions/" in str(exc) or "manifest row" in str(exc)
    else:  # the flip hit a byte zstd does not need, and every value came back as it was
        pytest.fail("a damaged positions chunk was read without a word")


def test_a_wrong_position_entry_is_damage(copy):
    import zarr

    positions = zarr.open_group(str(copy), mode="r+")["positions"]
    positions[7] = -1  # text 7 "not committed" in a store written whole
    with pytest.raises(StoreDamagedError, match="says text 7 is not committed, but it must be"):
        lw.open_store(copy)[7]
    assert "positions/" in str(lw.verify_store(copy))
    _positions_chunk(copy).unlink()
    assert not lw.verify_store(copy).ok


# ------------------------------------------------------------------------- 5. the root metadata
@pytest.mark.parametrize("layers", [[0, 1, 3, 2], [0, 1, 2, 2], [0, 1, 2, 4]])
def test_edited_layers_in_zarr_json_are_damage(copy, layers):
    """#55, 5: layers edited to [0,1,2,3,4,6,5], [..5,5] or an out-of-range 7 passed verify, and
    export wrote layer 5's vectors as layer_6."""
    document = json.loads((copy / "zarr.json").read_text())
    document["attributes"]["layerwise"]["layers"] = layers
    (copy / "zarr.json").write_text(json.dumps(document))
    result = cli("verify", copy)
    assert result.exit_code == 1 and "meta_sha256 does not match" in result.output
    exported = cli("export", copy, "-o", copy.parent / "e.parquet", "--layers", "-1")
    assert exported.exit_code == 1 and "DAMAGED" in exported.output
    # a record of a version that seals what it writes must carry its seal
    del document["attributes"]["layerwise"]["meta_sha256"]
    (copy / "zarr.json").write_text(json.dumps(document))
    with pytest.raises(StoreDamagedError, match="has lost its meta_sha256"):
        lw.open_store(copy)
    # the checks behind the seal hold for stores written before it (0.2 wrote none)
    document["attributes"]["layerwise"]["layerwise_version"] = "0.2.0"
    (copy / "zarr.json").write_text(json.dumps(document))
    with pytest.raises(StoreDamagedError, match="the metadata's layers"):
        lw.open_store(copy)


def test_a_flipped_byte_in_the_root_zarr_json_is_damaged_not_another_folder(copy):
    flip(copy / "zarr.json", 30, 0x01)
    result = cli("verify", copy)
    assert (
        result.exit_code == 1 and "DAMAGED" in result.output and "not a layerwise store" not in result.output
    )
    assert cli("info", copy).exit_code == 1
    written = cli("extract", copy.parent / "missing.txt", "-o", copy)
    assert written.exit_code != 0 and (copy / "data").is_dir()  # never written over


def test_a_store_whose_zarr_json_was_removed_is_damaged_not_another_folder(copy):
    """#81, 16: with its data, offsets and manifest still there, a store without zarr.json is a
    damaged store (exit 1), not "not a layerwise store" (exit 2)."""
    (copy / "zarr.json").unlink()
    result = cli("verify", copy)
    assert result.exit_code == 1 and "zarr.json, the store's metadata, is missing" in result.output
    assert cli("info", copy).exit_code == 1
    with pytest.raises(StoreDamagedError):
        lw.open_store(copy)
    written = cli("extract", copy.parent / "missing.txt", "-o", copy)
    assert written.exit_code != 0 and (copy / "data").is_dir()  # never written over


def _edit_json(file: Path, edit) -> None:
    document = json.loads(file.read_text())
    edit(document)
    file.write_text(json.dumps(document))


@pytest.mark.parametrize(
    "what, edit",
    [
        ("zarr.json", lambda d: d.update(node_type="array")),
        ("data/zarr.json", lambda d: d["shape"].__setitem__(0, 4)),  # fewer rows than the offsets reach
        ("data/zarr.json", lambda d: d["shape"].__setitem__(2, d["shape"][2] - 1)),  # another width
    ],
)
def test_info_refuses_a_store_whose_arrays_were_edited(copy, what, edit):
    """#81, 16: ``info`` read the record alone and exited 0 on a store whose root was made an array,
    or whose data array's shape was edited; it opens the store as a read does."""
    _edit_json(copy / what, edit)
    result = cli("info", copy)
    assert result.exit_code == 1 and "is damaged" in result.output
    assert cli("verify", copy).exit_code == 1


# ------------------------------------------------------------------------- 2. the activation cache
CACHE = lw.CacheOptions(layers="1,3", context=16, tokens=16 * 30, shard_bytes=8_000)


@pytest.fixture(scope="module")
def cache(tmp_path_factory, tiny_encoder) -> Path:
    path = tmp_path_factory.mktemp("cache") / "acts"
    lw.cache_activations(tiny_encoder, corpus(80, seed=5), path, CACHE)
    return path


@pytest.fixture
def cache_copy(cache, tmp_path) -> Path:
    shutil.copytree(cache, tmp_path / "acts")
    return tmp_path / "acts"


def test_the_record_holds_every_shards_checksum(cache):
    meta = json.loads((cache / "layerwise-cache.json").read_text())
    assert len(meta["shard_crc32"]) == meta["n_shards"] > 2 and meta["format_version"] == 2
    assert not list(cache.glob(".*.crc32"))  # moved into the record
    assert lw.verify_cache(cache).ok and len(lw.load_cache(cache)) == meta["n_contexts"]


def test_a_flipped_byte_in_a_cache_shard_is_damage(cache_copy):
    """#55, 2: 0.01 became 3.404e+36 and verify said OK, exit 0."""
    target = sorted(cache_copy.glob("data-*.arrow"))[1]
    flip(target, target.stat().st_size // 2, 0x40)
    result = cli("verify", cache_copy)
    assert result.exit_code == 1 and f"{target.name} differs from the CRC-32 written with it" in result.output
    with pytest.raises(StoreDamagedError, match=target.name):
        lw.load_cache(cache_copy)
    lw.load_cache(cache_copy, check=False)  # asked not to read the shards: opens


@pytest.mark.parametrize("field", ["layers", "model"])
def test_an_edited_cache_record_is_damage(cache_copy, field):
    meta = json.loads((cache_copy / "layerwise-cache.json").read_text())
    meta[field] = [1, 2] if field == "layers" else "bert-base-uncased"
    (cache_copy / "layerwise-cache.json").write_text(json.dumps(meta))
    result = cli("verify", cache_copy)
    assert result.exit_code == 1 and "the cache's record (layerwise-cache.json) differs" in result.output
    with pytest.raises(StoreDamagedError):
        lw.load_cache(cache_copy)


def test_a_flipped_byte_in_the_cache_record_is_damaged(cache_copy):
    flip(cache_copy / "layerwise-cache.json", 3, 0x01)
    for command in (("verify", cache_copy), ("info", cache_copy)):
        result = cli(*command)
        assert result.exit_code == 1 and "DAMAGED" in result.output, command


def test_shards_of_a_killed_run_keep_their_checksums_until_the_record_takes_them(
    tmp_path, tiny_encoder, monkeypatch
):
    import layerwise._cache.writer as cache_writer

    real, calls = cache_writer.write_shard, []

    def dies(path, name, *args):
        calls.append(name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(path, name, *args)

    monkeypatch.setattr(cache_writer, "write_shard", dies)
    with pytest.raises(KeyboardInterrupt):
        lw.cache_activations(tiny_encoder, corpus(80, seed=5), tmp_path / "acts", CACHE)
    assert len(list((tmp_path / "acts").glob(".data-*.arrow.crc32"))) == 2
    flip(sorted((tmp_path / "acts").glob("data-*.arrow"))[0], 100)
    assert "differs from the CRC-32" in str(lw.verify_cache(tmp_path / "acts"))


@pytest.mark.parametrize("name", ["state.json", "dataset_info.json"])
def test_a_changed_index_file_is_damage(cache_copy, name):
    """The files load_from_disk reads first: a flipped byte there renamed a shard or a column."""
    flip(cache_copy / name, 40, 0x01)
    assert f"{name} differs from the CRC-32 written with it" in str(lw.verify_cache(cache_copy))
    for check in (True, False):
        with pytest.raises(StoreDamagedError, match=name):
            lw.load_cache(cache_copy, check=check)


def test_an_offsets_entry_past_the_end_at_a_part_boundary_is_damage(copy):
    """Found by the byte-flip sweep: an entry raised past the last row where one part ends and the
    next begins passed the part's checks (its offsets still grew) and verify looped for ever."""
    import zarr

    first_of_third = int(parts(copy)[2].name.split("-")[1])
    offsets = zarr.open_group(str(copy), mode="r+")["offsets"]
    offsets[first_of_third] = int(lw.open_store(copy).n_rows) + 5000
    report = lw.verify_store(copy)
    assert not report.ok and f"offsets[{first_of_third}] points past the last committed row" in str(report)
