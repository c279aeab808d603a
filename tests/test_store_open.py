"""Opening a store reads nothing per text: len, store[i], slices, ids and iteration read only the
manifest parts, offsets and rows they need; old stores (without positions/) still open; a stale
id -> position entry is never trusted."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import corpus

import layerwise as lw
from layerwise.store._index import committed_count

LAYOUT = lw.StoreLayout(chunk_rows=8, shard_chunks=2, block_size=16)


@pytest.fixture(scope="module")
def token_store(tmp_path_factory, tiny):
    path = tmp_path_factory.mktemp("open") / "c.lw"
    lw.extract_to_store(tiny, corpus(90, seed=3), path, layout=LAYOUT)
    return path


@pytest.fixture(scope="module")
def reference(token_store):
    """Every text, read the way the store was read before it opened lazily: the whole manifest."""
    store = lw.open_store(token_store)
    return store.manifest.sort_by("text_id"), {i: store[i] for i in range(len(store))}


def _count_part_reads(monkeypatch) -> list[str]:
    reads: list[str] = []
    original = pq.ParquetFile.read

    def counted(self, *args, **kwargs):
        reads.append("part")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read", counted)
    return reads


def test_open_len_and_one_text_read_one_manifest_part(token_store, monkeypatch):
    n_parts = len(list((token_store / "manifest").glob("part-*.parquet")))
    assert n_parts > 5  # the test means something only when there are many parts
    reads = _count_part_reads(monkeypatch)
    store = lw.open_store(token_store)
    assert len(store) == 90 and store.complete and reads == []
    store[89]
    assert len(reads) == 1


def test_slices_ids_and_iteration_equal_text_by_text(token_store, reference):
    manifest, texts = reference
    store = lw.open_store(token_store)
    for got, i in zip(store[10:40:3], range(10, 40, 3), strict=True):
        np.testing.assert_array_equal(got.hidden, texts[i].hidden)
        assert got.tokens == texts[i].tokens and got.text == texts[i].text
    assert [s.text for s in store[-3:]] == [texts[i].text for i in (87, 88, 89)]
    assert [text_id for text_id, _ in store.items()] == list(range(90))
    assert list(store.ids) == manifest["text_id"].to_pylist() and store.ids[-1] == 89
    assert store.ids[5:8] == [5, 6, 7] and len(store.ids) == 90
    rows = store.manifest_rows([7, 3], ["text", "n_rows"])
    assert rows["text"].to_pylist() == [texts[7].text, texts[3].text]
    assert rows["n_rows"].to_pylist() == [texts[7].n_tokens, texts[3].n_tokens]


def test_far_apart_texts_are_read_apart(token_store, monkeypatch):
    """read_many of the first and last text reads their rows, not every row between them."""
    store = lw.open_store(token_store)
    spans: list[tuple[int, int]] = []
    from layerwise.store._lookup import TextLookup

    original = TextLookup.read_rows

    def spy(self, start, stop, text_ids):
        spans.append((start, stop))
        return original(self, start, stop, text_ids)

    monkeypatch.setattr(TextLookup, "read_rows", spy)
    first, last = store.read_many([0, 89])
    assert len(spans) == 2 and sum(b - a for a, b in spans) == first.n_tokens + last.n_tokens


def test_a_store_without_positions_still_opens_and_resumes(tmp_path, tiny, token_store, reference):
    _, texts = reference
    path = tmp_path / "old.lw"
    shutil.copytree(token_store, path)
    shutil.rmtree(path / "positions")  # as a store written by layerwise 0.2
    store = lw.open_store(path)
    assert len(store) == 90 and 17 in store and 90 not in store
    np.testing.assert_array_equal(store[17].hidden, texts[17].hidden)
    assert store.verify().ok
    lw.extract_to_store(tiny, corpus(90, seed=3), path, layout=LAYOUT)  # a resume with nothing to do
    assert lw.open_store(path).verify().ok


def test_a_stale_position_entry_is_not_trusted(tmp_path, tiny, monkeypatch):
    """A run killed between writing positions and its commit leaves entries for texts it never
    committed; they point past the commit, and resuming clears them before positions are reused."""
    import zarr

    path = tmp_path / "c.lw"
    lw.extract_to_store(tiny, corpus(30, seed=1), path, layout=LAYOUT)
    group = zarr.open_group(str(path), mode="r+")
    offsets = np.asarray(group["offsets"][:])
    group["offsets"][11:] = np.full(len(offsets) - 11, -1)  # only 10 texts committed now
    store = lw.open_store(path)
    assert len(store) == 10
    committed = {int(t) for t in store.text_ids()}
    from layerwise.store import _lookup as lookup

    monkeypatch.setattr(lookup, "IDS_AT_ONCE", 4)  # blocks of 4 ids: some hold no committed text
    in_order = sorted(committed)
    assert [store.ids[k] for k in range(10)] == in_order == list(store.ids)
    assert store.ids[-1] == in_order[-1] and store.ids[3:7] == in_order[3:7]
    monkeypatch.undo()
    stale = next(t for t in range(30) if t not in committed)
    assert stale not in store
    with pytest.raises(KeyError, match=f"text {stale} is not in the store"):
        store[stale]
    group["positions"][stale] = 3  # an entry that names a committed position of another text
    assert stale not in lw.open_store(path)
    lw.extract_to_store(tiny, corpus(30, seed=1), path, layout=LAYOUT)
    resumed = lw.open_store(path)
    assert len(resumed) == 30 and resumed.verify().ok
    assert resumed[stale].text == corpus(30, seed=1)[stale]


@pytest.mark.parametrize("gap", [False, True])
def test_committed_count_equals_a_full_scan(tmp_path, gap):
    """The chunked search finds the first fill value as a scan of the whole array does, also when
    the last commit's chunks were written out of order (a gap within its window)."""
    import zarr

    array = zarr.create_array(
        str(tmp_path / "o"), shape=(50_000,), chunks=(4096,), dtype="int64", fill_value=-1
    )
    array[:30_001] = np.arange(30_001)
    if gap:
        array[29_000:29_500] = -1  # the last commit (window 2,000) wrote its second chunk first
    values = np.asarray(array[:])
    expected = int(np.flatnonzero(values < 0)[0])
    assert committed_count(array, 2_000) == expected == (29_000 if gap else 30_001)
    assert committed_count(array, None) == expected
