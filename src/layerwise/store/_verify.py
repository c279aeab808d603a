"""Is a store whole? Two levels of checking, neither of which holds the store in memory.

* Opening a store (:func:`layout_problems`) checks what does not grow with the texts: the data
  array's shape and dtype against the metadata, the commit marker's first entry and last row
  against the data, the manifest parts' names, and that every committed data shard file exists
  (a directory listing). Each text read is then checked on its own: its manifest row must be at
  its position, name its id, and agree with the offsets about its rows; its rows must match the
  checksum written at commit (_reader.py). Without these a deleted manifest part or data shard
  silently returned another text's vectors or zeros.
* :func:`scan_store` (``Store.verify()``, ``layerwise verify``, and a writer before it resumes)
  goes through every manifest part in order, with the offsets it covers: the manifest has one row
  per committed position and no other, text ids are unique, each row's ``start``/``n_rows`` equal
  the offsets, offsets grow, every level's row count matches its tokens or words; and, for verify,
  every text's checksum (``crc32``), naming the texts affected. Memory: one part, one data shard
  and a bit per text id.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import StoreDamagedError
from ._checksum import crc32
from ._columns import numbers
from ._format import DATA, OFFSETS, POSITIONS
from ._parts import OpenedParts, damaged, open_parts, settle_zarr_reads
from ._report import VerifyReport
from ._resume import text_sha1

_LIST_COLUMN = {"token": "tokens", "word": "words"}


def _marker_holes(opened: OpenedParts, whole: bool) -> list[str]:
    """A writer fills the commit marker in order, so an unwritten entry (-1) followed by written
    ones is damage: the texts past the hole would otherwise read as never committed. ``whole``: look
    at every entry past the hole (verify), else at two chunks of them (opening stays constant)."""
    offsets, n_valid = opened.offsets, opened.n_valid
    if offsets is None or n_valid >= offsets.shape[0]:
        return []
    stop = None if whole else n_valid + 2 * int(offsets.chunks[0])
    rest = np.asarray(offsets[n_valid:stop], dtype=np.int64)
    written = np.flatnonzero(rest >= 0)
    if not written.size:
        return []
    k = n_valid + int(written[0])
    return [
        f"{OFFSETS}[{n_valid}] is unwritten but {OFFSETS}[{k}] holds {int(rest[written[0]])}: the commit "
        f"marker is damaged ({len(written)} entries past the hole; the texts from position "
        f"{n_valid - 1} on read as never committed)"
    ]


def layout_problems(
    opened: OpenedParts, whole_marker: bool = False
) -> tuple[list[str], list[tuple[int, int]], bool]:
    """What opening checks (module docstring): ``(problems, row ranges of missing data shards,
    whether the manifest can be scanned against the offsets at all)``."""
    problems = list(opened.problems)
    meta, path = opened.meta, opened.path
    try:
        data = opened.group[DATA]
    except KeyError:
        return [*problems, f"the data array ({DATA}/) is missing"], [], False
    except Exception as exc:  # its zarr.json damaged: not JSON, not UTF-8, not zarr's metadata
        return (
            [
                *problems,
                f"the data array's metadata ({DATA}/zarr.json) cannot be read: {type(exc).__name__}",
            ],
            [],
            False,
        )
    row_shape = tuple(meta.get("row_shape") or ())
    if tuple(data.shape[1:]) != row_shape:
        problems.append(f"data rows have shape {tuple(data.shape[1:])}, the metadata says {row_shape}")
    if str(data.dtype) != meta.get("dtype"):
        problems.append(f"data has dtype {data.dtype}, the metadata says {meta.get('dtype')}")
    if opened.offsets is None:
        return problems, [], False
    if opened.n_valid == 0 or int(opened.offsets[0]) != 0:
        return [*problems, f"{OFFSETS}[0] is not 0; the commit marker is damaged"], [], False
    n, n_texts = opened.n_committed, int(meta.get("n_texts", 0))
    if n > n_texts:
        problems.append(f"{n} texts are committed but the store was started for {n_texts}")
    problems += _marker_holes(opened, whole_marker)
    end = opened.end
    if end > data.shape[0]:
        problems.append(f"{OFFSETS} point to row {end} but the data array holds {data.shape[0]} rows")
    if n and not len(opened.manifest):
        problems.append(f"the manifest is missing ({n} texts are committed)")
    # every shard that holds committed rows must exist: zarr reads a missing one as fill values
    missing: list[tuple[int, int]] = []
    shard_rows = int(meta.get("chunk_rows", 0)) * int(meta.get("shard_chunks", 0))
    if shard_rows > 0 and end > 0:
        tail = (0,) * (data.ndim - 1)
        for shard in range(-(-min(end, data.shape[0]) // shard_rows)):
            key = data.metadata.encode_chunk_key((shard, *tail))
            if not (path / DATA / key).is_file():
                lo, hi = shard * shard_rows, (shard + 1) * shard_rows
                problems.append(f"data shard {DATA}/{key} (rows {lo}..{hi - 1}) is missing")
                missing.append((lo, hi))
    return problems, missing, True


class _Scan:
    """The per-part checks of :func:`scan_store`, accumulated over the parts."""

    def __init__(self, opened: OpenedParts, missing_shards: list[tuple[int, int]], checksums: bool) -> None:
        self.opened, self.missing_shards, self.checksums = opened, missing_shards, checksums
        self.n_texts = int(opened.meta.get("n_texts", 0))
        self.level = opened.meta.get("level")
        self.seen = np.zeros((self.n_texts + 8) // 8, dtype=np.uint8)  # a bit per text id
        self.problems: list[str] = []
        self.affected: set[int] = set()
        self.rows_read = 0
        self.missing: list[int] = []  # per part, its first position without a manifest row
        self.n_missing = self.n_duplicated = 0
        self.first_duplicated: int | None = None
        kinds = ("twice", "outside", "disagree", "length", "sentence", "crc", "positions", "sha1")
        self.counts = dict.fromkeys(kinds, 0)
        self.positions_unreadable: list[str] = []
        self.parts_skipped = 0
        self.check_positions = True
        self.firsts: dict[str, int] = {}
        self.unreadable: list[str] = []
        self._block_lo, self._block_len = 0, 0
        self._block: np.ndarray | None = None
        shard_rows = int(opened.meta.get("chunk_rows", 0)) * int(opened.meta.get("shard_chunks", 0))
        self.step = shard_rows or 65536

    def _count(self, what: str, ids: np.ndarray) -> None:
        if ids.size:
            self.counts[what] += int(ids.size)
            self.firsts.setdefault(what, int(ids[0]))
            self.affected.update(int(t) for t in ids)

    def part(self, k: int, table) -> None:
        lo, hi = self.opened.manifest.span(k)
        positions = numbers(table["position"])
        ids = numbers(table["text_id"])
        self.rows_read += len(positions)
        if len(positions) != hi - lo or not np.array_equal(positions, np.arange(lo, hi)):
            present = set(positions.tolist())
            absent = [p for p in range(lo, hi) if p not in present]
            if absent:
                self.n_missing += len(absent)
                self.missing.append(absent[0])
            repeated = positions[1:][positions[1:] == positions[:-1]]
            if repeated.size:
                self.n_duplicated += int(repeated.size)
                if self.first_duplicated is None:
                    self.first_duplicated = int(repeated[0])
                self.affected.update(
                    int(t) for t, p in zip(ids, positions, strict=True) if p in set(repeated)
                )
            return
        outside = ids[(ids < 0) | (ids >= self.n_texts)]
        self._count("outside", outside)
        inside = ids[(ids >= 0) & (ids < self.n_texts)]
        byte, bit = inside >> 3, (1 << (inside & 7)).astype(np.uint8)
        unique, counts = np.unique(inside, return_counts=True)
        twice = np.union1d(unique[counts > 1], inside[(self.seen[byte] & bit) != 0])
        self._count("twice", twice)
        np.bitwise_or.at(self.seen, byte, bit)
        offsets = self.opened.offsets_span(lo, hi + 1)
        falling = np.flatnonzero(np.diff(offsets) < 0)
        if falling.size:
            self.problems.append(
                f"{OFFSETS} decrease at position {lo + int(falling[0]) + 1}; the commit marker is damaged"
            )
            return
        beyond = np.flatnonzero(offsets > self.opened.end)
        if beyond.size:  # past the last committed row: where the next part starts, they fall
            self.problems.append(
                f"{OFFSETS}[{lo + int(beyond[0])}] points past the last committed row "
                f"{self.opened.end}; the commit marker is damaged"
            )
            return
        starts, n_rows = numbers(table["start"]), numbers(table["n_rows"])
        self._count("disagree", ids[(starts != offsets[:-1]) | (n_rows != np.diff(offsets))])
        column = _LIST_COLUMN.get(str(self.level))
        if column is not None and column in table.column_names:
            import pyarrow.compute as pc

            lengths = pc.list_value_length(table[column]).to_numpy(zero_copy_only=False)
            self._count("length", ids[lengths != n_rows])
        elif self.level == "sentence":
            self._count("sentence", ids[n_rows != 1])
        if self.check_positions:
            self._positions(ids, lo, hi)
        for shard_lo, shard_hi in self.missing_shards:
            self.affected.update(int(t) for t in ids[(offsets[1:] > shard_lo) & (offsets[:-1] < shard_hi)])
        if self.checksums and "crc32" in table.column_names:
            self._checksums(offsets, ids, numbers(table["crc32"]))
        if self.check_positions and "text_sha1" in table.column_names and "text" in table.column_names:
            texts = zip(table["text"].to_pylist(), table["text_pair"].to_pylist(), strict=True)
            recorded = table["text_sha1"].to_pylist()
            wrong = [
                i
                for i, (pair, want) in enumerate(zip(texts, recorded, strict=True))
                if want is not None and text_sha1(*pair) != want
            ]
            self._count("sha1", ids[wrong])

    def _positions(self, ids: np.ndarray, lo: int, hi: int) -> None:
        """``positions[text_id]`` of this part's texts must be their positions (format.py)."""
        array = self.opened.positions.array
        inside = ids[(ids >= 0) & (ids < self.n_texts)]
        if array is None or not inside.size:
            return
        try:
            first = int(inside.min())
            found = np.asarray(array[first : int(inside.max()) + 1], dtype=np.int64)[inside - first]
        except Exception as exc:  # zarr cannot decode a chunk
            self.positions_unreadable.append(f"{POSITIONS}/ cannot be read ({type(exc).__name__}: {exc})")
            return
        want = np.arange(lo, hi)[(ids >= 0) & (ids < self.n_texts)]
        self._count("positions", inside[found != want])

    def positions_problems(self) -> list[str]:
        """The entries of texts not committed must not point into the committed positions (a read
        of such a text would find another's row). One pass over the map, a million ids at a time."""
        problems = list(dict.fromkeys(self.positions_unreadable))
        array, n = self.opened.positions.array, self.opened.n_committed
        if self.counts["positions"]:
            problems.append(
                f"{POSITIONS}/ gives {self.counts['positions']} committed texts another position than "
                f"their manifest row (first: text {self.firsts['positions']})"
            )
        if array is None or problems or self.parts_skipped:  # which ids are committed is not known
            return problems
        step = 1 << 20
        for lo in range(0, self.n_texts, step):
            hi = min(lo + step, self.n_texts)
            try:
                found = np.asarray(array[lo:hi], dtype=np.int64)
            except Exception as exc:
                return [f"{POSITIONS}/ cannot be read ({type(exc).__name__}: {exc})"]
            committed = (self.seen[np.arange(lo, hi) >> 3] & (1 << (np.arange(lo, hi) & 7))) != 0
            stray = np.flatnonzero(~committed & (found >= 0) & (found < n))
            if stray.size:
                self.affected.update(int(lo + i) for i in stray[:1000])
                return [
                    f"{POSITIONS}/ gives {stray.size} texts that are not committed a committed "
                    f"position (first: text {lo + int(stray[0])})"
                ]
        return []

    def _checksums(self, offsets: np.ndarray, ids: np.ndarray, expected: np.ndarray) -> None:
        data = self.opened.group[DATA]
        end = self.opened.end
        for i in range(len(ids)):
            row, stop = int(offsets[i]), int(offsets[i + 1])
            running, broken = 0, False
            while row < stop:
                if not self._block_lo <= row < self._block_lo + self._block_len:
                    self._block_lo = (row // self.step) * self.step  # one bad shard spoils one block
                    self._block_len = min(self._block_lo + self.step, end) - self._block_lo
                    try:
                        self._block = np.asarray(data[self._block_lo : self._block_lo + self._block_len])
                    except Exception as exc:  # zarr raises ValueError for a shard it cannot decode
                        settle_zarr_reads()
                        self._block = None
                        last = self._block_lo + self._block_len - 1
                        self.unreadable.append(f"rows {self._block_lo}..{last} cannot be read ({exc})")
                take = min(stop, self._block_lo + self._block_len) - row
                if take <= 0:  # nothing more to read (rows past the data): cannot be checked
                    broken = True
                    break
                if self._block is None:
                    broken = True
                else:
                    piece = self._block[row - self._block_lo : row - self._block_lo + take]
                    running = crc32(np.ascontiguousarray(piece), running)
                row += take
            if broken or running != int(expected[i]):
                self.counts["crc"] += 0 if broken else 1
                self.affected.add(int(ids[i]))

    def finish(self, n: int) -> list[str]:
        problems = list(self.problems)
        if self.n_missing or self.n_duplicated:
            detail = []
            if self.n_missing:
                detail.append(f"{self.n_missing} positions missing (first {min(self.missing)})")
            if self.n_duplicated:
                detail.append(f"{self.n_duplicated} duplicated (first {self.first_duplicated})")
            problems.append(
                f"the manifest has {self.rows_read} rows for {n} committed texts ({'; '.join(detail)}); "
                "a manifest part was deleted, copied or changed"
            )
        c, f = self.counts, self.firsts
        if c["twice"]:
            problems.append(
                f"{c['twice']} text ids appear more than once in the manifest (first {f['twice']})"
            )
        if c["outside"]:
            problems.append(f"text id {f['outside']} is outside 0..{self.n_texts - 1}")
        if c["disagree"]:
            problems.append(
                f"{c['disagree']} manifest rows disagree with {OFFSETS} about where their rows are "
                f"(first: text {f['disagree']})"
            )
        if c["length"]:
            problems.append(f"{c['length']} texts have a row count that differs from their {self.level}s")
        if c["sentence"]:
            problems.append("a sentence store holds more than one row for some texts")
        if c["sha1"]:
            problems.append(
                f"{c['sha1']} texts differ from their text_sha1 in the manifest (first: text {f['sha1']})"
            )
        problems += self.unreadable
        if c["crc"] and not self.unreadable:
            problems.append(
                f"{c['crc']} texts' rows differ from the checksum written when they were committed"
            )
        return problems


def scan_store(path: str | os.PathLike, *, checksums: bool = True) -> VerifyReport:
    """Check one (unsharded) store part by part (module docstring); never raises for damage,
    reports it. ``checksums=False``: the structure only (what a writer checks before resuming)."""
    try:
        opened = open_parts(Path(path))
    except StoreDamagedError as exc:  # its metadata cannot be read or was changed
        return VerifyReport(Path(path), 0, 0, list(exc.problems))
    problems, missing_shards, scannable = layout_problems(opened, whole_marker=True)
    n = opened.n_committed
    report = VerifyReport(Path(path), n, opened.end if opened.offsets is not None and opened.n_valid else 0)
    report.n_expected = int(opened.meta.get("n_texts", 0))
    columns = ("text_id", "position", "start", "n_rows", "crc32", *_LIST_COLUMN.values())
    if checksums:  # each text against its SHA-1 too
        columns += ("text", "text_pair", "text_sha1")
    names = opened.manifest.column_names()
    report.checksums = checksums and "crc32" in names
    if not scannable or not len(opened.manifest):
        report.problems = problems
        return report
    scan = _Scan(opened, missing_shards, report.checksums and not problems)
    scan.check_positions = checksums
    for k in range(len(opened.manifest)):
        try:
            table = opened.manifest.load(k, columns)
        except StoreDamagedError as exc:  # its bytes differ from its checksum, or it is not Parquet
            problems += exc.problems
            scan.rows_read += max(0, opened.manifest.span(k)[1] - opened.manifest.span(k)[0])
            scan.parts_skipped += 1
            continue
        except OSError as exc:  # removed while we read
            problems.append(f"manifest part {opened.manifest.names[k]} cannot be read ({exc})")
            scan.parts_skipped += 1
            continue
        scan.part(k, table)
    # a writer rebuilds the id -> position map before it resumes (index.renew_positions): its
    # structural check (checksums=False) leaves the map out
    report.problems = problems + scan.finish(n) + (scan.positions_problems() if checksums else [])
    report.text_ids = sorted(scan.affected)
    return report


def check_structure(path: Path) -> None:
    """Raise :class:`StoreDamagedError` naming every structural inconsistency (no checksums)."""
    report = scan_store(path, checksums=False)
    if report.problems:
        raise damaged(path, report.problems, report.text_ids)


def rows_checksum(rows: np.ndarray) -> int:
    """CRC-32 of a text's rows as stored (C order, the store's dtype)."""
    return crc32(np.ascontiguousarray(rows))  # numpy arrays are buffers


def verify_one_store(path: str | os.PathLike, *, block_rows: int = 65536) -> VerifyReport:
    """Check one (unsharded) store's structure and every text's checksum (:func:`scan_store`).
    ``layerwise.verify_store`` also takes a sharded store (_api.py). ``block_rows`` is kept for
    callers; data is read a shard at a time."""
    return scan_store(path, checksums=True)


__all__ = [
    "VerifyReport",
    "check_structure",
    "layout_problems",
    "rows_checksum",
    "scan_store",
    "verify_one_store",
]
