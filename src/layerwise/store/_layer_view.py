"""``store.array(layer)``: one layer over every committed row, read lazily and checked.

A bulk read cuts across texts, so it is checked the way a text's read is: the rows asked for are
widened to the whole texts that hold them, every layer of those rows is read (a chunk holds every
layer of its rows, so zarr reads them anyway), and each text's rows must match the CRC-32 its
manifest row was committed with. A swapped or flipped data shard is then an error naming the
texts, never numbers. Cost: one CRC over the bytes read (about 3.7 GB/s) and the manifest's
``crc32`` column, a part at a time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from .._results import to_dtype
from ._columns import numbers
from ._format import OFFSETS
from ._parts import damaged
from ._verify import rows_checksum

if TYPE_CHECKING:
    from ._opened import OpenedStore

_CHUNKS_CACHED = 16
_CHECK_COLUMNS = ("position", "start", "n_rows", "crc32")


class RowIndex:
    """Which committed text holds a row: the offsets array (the commit marker) read a zarr chunk
    at a time, a few chunks cached, searched by each chunk's first entry, then within it."""

    def __init__(self, offsets, n_valid: int) -> None:
        self._offsets, self._n_valid = offsets, n_valid
        self._step = int(offsets.chunks[0]) if offsets is not None else 1
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()

    def _chunk(self, c: int) -> np.ndarray:
        values = self._cache.get(c)
        if values is None:
            lo = c * self._step
            values = np.asarray(self._offsets[lo : min(lo + self._step, self._n_valid)], dtype=np.int64)
            self._cache[c] = values
            while len(self._cache) > _CHUNKS_CACHED:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(c)
        return values

    def span(self, lo: int, hi: int) -> np.ndarray:
        """``offsets[lo:hi]`` (within the valid prefix)."""
        pieces = []
        for c in range(lo // self._step, -(-hi // self._step)):
            first = c * self._step
            pieces.append(self._chunk(c)[max(lo - first, 0) : hi - first])
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)

    def text_of(self, row: int) -> int:
        """The position of the committed text whose rows hold ``row`` (offsets[p] <= row < offsets[p+1])."""
        lo, hi = 0, (self._n_valid - 2) // self._step  # chunks that hold a text's first offset
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if int(self._chunk(mid)[0]) <= row:
                lo = mid
            else:
                hi = mid - 1
        values = self._chunk(lo)[: self._n_valid - 1 - lo * self._step]
        return lo * self._step + int(np.searchsorted(values, row, side="right")) - 1


class LayerView:
    """A lazy ``(n_rows, dim)`` view of one layer over every committed row of a store; every read
    checked against the checksums of the texts it touches (module docstring)."""

    def __init__(self, store: OpenedStore, layer_position: int | None) -> None:
        self._store, self._layer = store, layer_position
        self._data = store.data
        self._n = store.n_rows
        self._index = RowIndex(store.parts.offsets, store.parts.n_valid)
        self.shape = (self._n, self._data.shape[-1])
        self.dtype = self._data.dtype
        self._check_extent()

    def _check_extent(self) -> None:
        """The view's length is the commit marker's last entry: it must be where the last committed
        text's manifest row says its rows end, or a damaged marker would cut every bulk read short
        (or stretch it) with no text's check noticing."""
        n = self._store.parts.n_committed
        if not n:
            return
        ((start, n_rows, _),) = self._expected(n - 1, n)
        first, end = (int(v) for v in self._index.span(n - 1, n + 1))
        if start != first or start + n_rows != end:
            raise self._store.changed_under_us() or damaged(
                self._store.path,
                [
                    f"{OFFSETS} say the last committed text (position {n - 1}) holds rows "
                    f"{first}..{end - 1}, its manifest row says {start}..{start + n_rows - 1}: the "
                    "commit marker is damaged"
                ],
                [],
            )

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, rows) -> np.ndarray:
        if isinstance(rows, tuple):  # view[rows, columns]: the rows checked, then the columns taken
            head, *tail = rows
            picked = self[head]
            return picked[tuple(tail)] if isinstance(head, int | np.integer) else picked[(slice(None), *tail)]
        if isinstance(rows, slice):
            start, stop, step = rows.indices(self._n)
            if step == 1 and start < stop:  # one run of texts, one read
                (lo, hi, texts), *more = list(self._groups(np.asarray([start, stop - 1])))
                if not more:
                    block = self._checked(lo, hi, np.arange(int(texts[0]), int(texts[-1]) + 1))
                    picked = block[start - lo : stop - lo]
                    return picked if self._layer is None else np.ascontiguousarray(picked[:, self._layer])
            wanted = np.arange(start, stop, step, dtype=np.int64)
        elif isinstance(rows, int | np.integer):
            if not -self._n <= rows < self._n:
                raise IndexError(f"row {rows} out of range for {self._n} rows")
            return self[np.asarray([int(rows) % self._n])][0]
        else:
            wanted = np.asarray(rows)
            if wanted.dtype == bool:
                wanted = np.flatnonzero(wanted)
            wanted = wanted.astype(np.int64).reshape(-1)
            if wanted.size and (wanted.min() < 0 or wanted.max() >= self._n):
                raise IndexError(f"rows out of range for {self._n} rows")
        out = np.empty((len(wanted), *self._row_shape()), dtype=self.dtype)
        if not len(wanted):
            return out
        order = np.argsort(wanted, kind="stable")
        sorted_rows = wanted[order]
        for lo, hi, texts in self._groups(sorted_rows):
            block = self._checked(lo, hi, texts)
            inside = (sorted_rows >= lo) & (sorted_rows < hi)
            picked = block[sorted_rows[inside] - lo]
            out[order[inside]] = picked if self._layer is None else picked[:, self._layer]
        return out

    def _row_shape(self) -> tuple[int, ...]:
        return (self._data.shape[-1],)

    def _groups(self, sorted_rows: np.ndarray) -> Iterator[tuple[int, int, np.ndarray]]:
        """``(first row, one past the last, positions)`` of runs of texts read with one zarr read:
        every text holding a wanted row, texts closer than a shard read through."""
        first, last = self._index.text_of(int(sorted_rows[0])), self._index.text_of(int(sorted_rows[-1]))
        offsets = self._index.span(first, last + 2)
        positions = np.unique(np.searchsorted(offsets, sorted_rows, side="right") - 1) + first
        starts, stops = offsets[positions - first], offsets[positions - first + 1]
        gap = self._store.lookup.gap()
        cuts = np.flatnonzero(starts[1:] - stops[:-1] > gap) + 1
        for group in np.split(np.arange(len(positions)), cuts):
            yield int(starts[group[0]]), int(stops[group[-1]]), positions[group]

    def _checked(self, lo: int, hi: int, positions: np.ndarray) -> np.ndarray:
        """Rows ``lo..hi-1`` (every layer), each text at ``positions`` that lies in them checked."""
        stored = self._store.lookup.read_rows(lo, hi, [])
        expected = self._expected(int(positions[0]), int(positions[-1]) + 1)
        offsets = self._index.span(int(positions[0]), int(positions[-1]) + 2)
        first = int(positions[0])
        bad = []
        for p in positions.tolist():
            start, stop = int(offsets[p - first]), int(offsets[p - first + 1])
            row = expected[p - first]
            if row[0] != start or row[1] != stop - start:
                raise self._store.changed_under_us() or damaged(
                    self._store.path,
                    [f"the manifest row of position {p} disagrees with {OFFSETS} about where its rows are"],
                    [],
                )
            if row[2] >= 0 and rows_checksum(stored[start - lo : stop - lo]) != row[2]:
                bad.append(p)
        if bad:
            ids = self._text_ids(bad)
            raise self._store.changed_under_us() or damaged(
                self._store.path,
                [
                    f"rows {lo}..{hi - 1}: the rows of {len(bad)} texts differ from the checksums written "
                    "when they were committed"
                ],
                ids,
            )
        return stored

    def _expected(self, lo: int, hi: int) -> np.ndarray:
        """``(start, n_rows, crc32)`` of positions ``lo..hi-1`` from the manifest (crc -1 where the
        store has none), each part's rows checked to be its positions."""
        parts = self._store.parts.manifest
        out = np.full((hi - lo, 3), -1, dtype=np.int64)
        position = lo
        while position < hi:
            k = parts.part_of(position)
            first, stop = parts.span(k) if k >= 0 else (position, position)
            try:
                table = parts.read(k, _CHECK_COLUMNS) if k >= 0 else None
            except OSError as exc:
                raise self._store.changed_under_us() or self._store.lookup.part_unreadable(
                    parts.names[k], exc, []
                ) from exc
            end = min(stop, hi)
            if table is None or table.num_rows < end - first or end <= position:
                raise self._store.changed_under_us() or damaged(
                    self._store.path, [f"the manifest row of position {position} is missing"], []
                )
            local = slice(position - first, end - first)
            got = numbers(table["position"])[local]
            if not np.array_equal(got, np.arange(position, end)):
                raise self._store.changed_under_us() or damaged(
                    self._store.path, [f"manifest part {parts.names[k]} does not hold its positions"], []
                )
            out[position - lo : end - lo, 0] = numbers(table["start"])[local]
            out[position - lo : end - lo, 1] = numbers(table["n_rows"])[local]
            if "crc32" in table.column_names:
                out[position - lo : end - lo, 2] = numbers(table["crc32"])[local]
            position = end
        return out

    def _text_ids(self, positions: list[int]) -> list[int]:
        parts = self._store.parts.manifest
        ids = []
        for p in positions[:20]:
            k = parts.part_of(p)
            ids.append(int(numbers(parts.read(k, ("text_id",))["text_id"])[p - int(parts.firsts[k])]))
        return ids

    def iter_chunks(self, rows: int = 8192) -> Iterator[np.ndarray]:
        """Consecutive blocks of rows, for statistics over corpora larger than memory."""
        for start in range(0, self._n, rows):
            yield self[start : min(start + rows, self._n)]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        array = self[0 : self._n]
        return to_dtype(array, dtype, "the rows read") if dtype is not None else array
