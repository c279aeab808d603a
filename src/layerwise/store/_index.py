"""Where a committed text is, found without reading the whole store.

Opening a store reads what does not grow with the texts: the metadata, the manifest folder's
listing (one name per part) and a few chunks of the commit marker. Everything per text is read
when asked, a chunk or a part at a time:

* how many texts are committed: a binary search over the offsets array's chunks for the last one
  whose first entry is written, then a scan of the last commit's window (a commit writes at most
  one shard's texts, and zarr may write its chunks in any order, so a gap can only be there);
* a text's rows: two offsets entries;
* a text's position from its id: ``positions[text_id]`` (format.py), written before the commit
  marker and trusted only when the manifest row at that position names the same text. Stores
  written before that array existed get the same map from the manifest's ``text_id`` column, read
  once (8 bytes a text);
* a text's manifest row: the part whose first position is the last one at or below it (part
  names carry their first position), read with only the columns asked for, a few parts cached.
"""

from __future__ import annotations

import bisect
import os
import re
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..errors import StoreDamagedError
from ._checksum import crc32
from ._columns import numbers
from ._format import MANIFEST, OFFSETS_CHUNK, POSITIONS, damaged

_PARTS_CACHED = 4


def committed_count(offsets_array, window: int | None) -> int:
    """How many entries of the offsets array are valid: those before the first fill value (-1).
    ``window``: the most texts one commit writes (None: scan the whole array, as for a store that
    does not record its layout)."""
    size = int(offsets_array.shape[0])
    chunk = int(offsets_array.chunks[0])
    if window is None or size <= chunk:
        values = np.asarray(offsets_array[:])
        invalid = np.flatnonzero(values < 0)
        return int(invalid[0]) if invalid.size else size
    lo, hi = 0, (size - 1) // chunk  # the last chunk whose first entry is written
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(offsets_array[mid * chunk]) >= 0:
            lo = mid
        else:
            hi = mid - 1
    start = max(0, lo * chunk - window - 1)
    stop = min(size, (lo + 1) * chunk)
    invalid = np.flatnonzero(np.asarray(offsets_array[start:stop]) < 0)
    return start + int(invalid[0]) if invalid.size else stop


_PART_NAME = re.compile(r"part-(\d+)(?:-([0-9a-f]{8}))?\.parquet")


def part_firsts(path: Path) -> tuple[np.ndarray, list[str], list[str]]:
    """``(first positions, file names, problems)`` of the manifest parts, sorted by first position.
    A name that is not ``part-<position>-<crc32>.parquet`` (or 0.2's ``part-<position>.parquet``;
    a copy, say) is a problem: the part it copies would be read twice. So are two parts that
    start at the same position."""
    folder = path / MANIFEST
    try:
        names = [n for n in os.listdir(folder) if n.startswith("part-") and n.endswith(".parquet")]
    except FileNotFoundError:
        names = []
    firsts: dict[int, str] = {}
    problems: list[str] = []
    for name in sorted(names):
        match = _PART_NAME.fullmatch(name)
        if match is None:
            problems.append(f"manifest part {name!r} is not one the writer makes (duplicated?)")
            continue
        first = int(match.group(1))
        if first in firsts:
            problems.append(f"manifest parts {firsts[first]!r} and {name!r} both start at position {first}")
            continue
        firsts[first] = name
    order = sorted(firsts)
    return np.asarray(order, dtype=np.int64), [firsts[f] for f in order], problems


def part_checksum(name: str) -> int | None:
    """The CRC-32 a part's name records (None for a part written before names carried one)."""
    match = _PART_NAME.fullmatch(name)
    return int(match.group(2), 16) if match is not None and match.group(2) else None


def part_damaged(path: Path, name: str, reason: str) -> StoreDamagedError:
    """A manifest part whose bytes differ from its name's checksum, or that pyarrow cannot read."""
    return damaged(path, [f"manifest part {MANIFEST}/{name} {reason}"], [])


class ManifestParts:
    """The committed manifest, read part by part with the columns asked for."""

    def __init__(self, path: Path, n_committed: int) -> None:
        self.path = path
        firsts, names, self.problems = part_firsts(path)
        keep = int(np.searchsorted(firsts, n_committed, side="left"))  # parts past the marker: stale
        self.firsts, self.names, self.n = firsts[:keep], names[:keep], n_committed
        if self.n and (not len(self.firsts) or self.firsts[0] != 0):
            self.problems.append("the manifest part holding position 0 is missing")
        self._cache: OrderedDict[tuple[int, tuple[str, ...] | None], object] = OrderedDict()
        self._bytes: OrderedDict[int, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self.firsts)

    def span(self, k: int) -> tuple[int, int]:
        """The positions part ``k`` must hold: up to the next part's first, or the commit."""
        stop = int(self.firsts[k + 1]) if k + 1 < len(self.firsts) else self.n
        return int(self.firsts[k]), stop

    def part_of(self, position: int) -> int:
        return bisect.bisect_right(self.firsts, position) - 1

    def read(self, k: int, columns: tuple[str, ...] | None = None):
        """Part ``k`` as a pyarrow Table (cut to the committed positions), cached. The part's
        checked bytes are cached too: another set of columns of it is parsed, not read again."""
        key = (k, columns)
        table = self._cache.get(key)
        if table is None:
            table = self._cache[key] = self._parse(k, self._cached_bytes(k), columns)
            while len(self._cache) > _PARTS_CACHED:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return table

    def _cached_bytes(self, k: int) -> bytes:
        content = self._bytes.get(k)
        if content is None:
            content = self._bytes[k] = self.checked_bytes(k)
            while len(self._bytes) > _PARTS_CACHED:
                self._bytes.popitem(last=False)
        else:
            self._bytes.move_to_end(k)
        return content

    def column_names(self) -> list[str]:
        """The manifest's columns (the first part's schema; the parts share one)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not len(self.names):
            return []
        try:  # from the checked bytes: a changed footer could rename a column
            return list(pq.read_schema(pa.BufferReader(self._cached_bytes(0))).names)
        except (OSError, pa.ArrowException) as exc:
            raise part_damaged(self.path, self.names[0], f"cannot be read as Parquet ({exc})") from None

    def iter_tables(self, columns: tuple[str, ...] | None = None):
        """``(k, table)`` for each part in position order, uncached (bounded memory)."""
        for k in range(len(self.names)):
            yield k, self.load(k, columns)

    def load(self, k: int, columns: tuple[str, ...] | None):
        """Part ``k``'s ``columns`` (those it has; all when None), cut to its committed positions,
        uncached. The whole file is read and checked against the CRC-32 in its name before it is
        parsed: StoreDamagedError when it differs or pyarrow cannot read it; FileNotFoundError
        when gone."""
        return self._parse(k, self.checked_bytes(k), columns)

    def checked_bytes(self, k: int) -> bytes:
        """Part ``k``'s file, whole, checked against the CRC-32 in its name."""
        name = self.names[k]
        content = (self.path / MANIFEST / name).read_bytes()
        expected = part_checksum(name)
        if expected is not None and crc32(content) != expected:
            raise part_damaged(self.path, name, "differs from the checksum in its name (its bytes changed)")
        return content

    def _parse(self, k: int, content: bytes, columns: tuple[str, ...] | None):
        import pyarrow as pa
        import pyarrow.parquet as pq

        name = self.names[k]
        try:
            file = pq.ParquetFile(pa.BufferReader(content))
            wanted = None if columns is None else [c for c in columns if c in file.schema_arrow.names]
            table = file.read(columns=wanted)
        except (OSError, pa.ArrowException) as exc:
            raise part_damaged(self.path, name, f"cannot be read as Parquet ({exc})") from None
        lo, hi = self.span(k)
        return table.slice(0, max(0, min(table.num_rows, hi - lo)))  # rows past the commit


class IdPositions:
    """text id -> store position, or -1 when the id is not committed."""

    def __init__(self, array, parts: ManifestParts, n_texts: int) -> None:
        self.array = array  # the zarr array, or None for a store written before it existed
        self._parts, self._n_texts = parts, n_texts
        self._built: np.ndarray | None = None

    def lookup(self, text_ids: np.ndarray) -> np.ndarray:
        """Positions of ``text_ids`` (all within 0..n_texts-1), -1 where not committed; to be
        confirmed against the manifest row (an entry past the commit may be stale)."""
        if self.array is not None:
            if len(text_ids) == 1:
                found = np.asarray([self.array[int(text_ids[0])]], dtype=np.int64)
            else:
                lo, hi = int(text_ids.min()), int(text_ids.max()) + 1
                if hi - lo <= 64 * len(text_ids) + 4096:  # one read of the range they span
                    found = np.asarray(self.array[lo:hi], dtype=np.int64)[text_ids - lo]
                else:
                    found = np.asarray(self.array.get_coordinate_selection(text_ids), dtype=np.int64)
        else:
            found = self._fallback()[text_ids]
        found[found >= self._parts.n] = -1
        return found

    def _fallback(self) -> np.ndarray:
        """The map built from the manifest's text_id column (stores without ``positions/``)."""
        if self._built is None:
            built = np.full(self._n_texts, -1, dtype=np.int64)
            for k, table in self._parts.iter_tables(("text_id",)):
                first = self._parts.span(k)[0]
                ids = numbers(table["text_id"])
                inside = (ids >= 0) & (ids < self._n_texts)
                built[ids[inside]] = first + np.flatnonzero(inside)
            self._built = built
        return self._built

    def committed_ids(self, lo: int, hi: int) -> np.ndarray:
        """The committed text ids in ``lo..hi-1``, ascending (not confirmed against the manifest)."""
        if self.array is not None:
            found = np.asarray(self.array[lo:hi], dtype=np.int64)
        else:
            found = self._fallback()[lo:hi]
        return lo + np.flatnonzero((found >= 0) & (found < self._parts.n))


def create_positions(group, n_texts: int):
    """The id -> position map (format.py), every entry -1 until its text is committed."""
    return group.create_array(
        POSITIONS, shape=(max(n_texts, 1),), chunks=(OFFSETS_CHUNK,), dtype="int64", fill_value=-1
    )


def renew_positions(group, n_texts: int, manifest) -> None:
    """Before resuming: the id -> position map holds exactly the committed texts. A run killed
    between a manifest part and its commit left entries for texts it never committed (their
    positions will be reused); a store written before the map existed gets it now."""
    try:
        positions = group[POSITIONS]
    except KeyError:
        positions = create_positions(group, n_texts)
    want = np.full(positions.shape[0], -1, dtype=np.int64)
    if manifest is not None and len(manifest):
        ids = numbers(manifest["text_id"])
        want[ids] = np.arange(len(ids))
    for lo in range(0, len(want), 1 << 20):
        hi = min(lo + (1 << 20), len(want))
        try:
            same = np.array_equal(np.asarray(positions[lo:hi]), want[lo:hi])
        except Exception:  # a chunk zarr cannot decode: rewritten whole
            same = False
        if not same:
            positions[lo:hi] = want[lo:hi]
