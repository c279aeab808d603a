"""The commit protocol: rows, then a manifest part, then the offsets (the commit marker).

:class:`ShardBuffer` collects rows on the compute thread and cuts them into whole shards;
:class:`Committer` writes each flushed piece on a background thread, so disk writes overlap compute:

1. the rows (whole Zarr shards; zarr >= 3.1.3 writes each file atomically: temp file + rename);
2. a manifest part for the texts those rows complete, written as a hidden temp file and renamed
   (pyarrow skips names that start with "." when it reads the manifest folder);
3. the offsets entries of those texts: only now can a reader see them.

A crash between any two steps leaves data past the commit marker, which readers ignore and the
next run rewrites.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import StoreError
from ._checksum import crc32
from ._columns import records_table
from ._format import DATA, MANIFEST, OFFSETS, POSITIONS

logger = logging.getLogger("layerwise")


def part_name(first_position: int, crc32: int) -> str:
    """A manifest part's file name: its first position, and the CRC-32 of its bytes (_index.py
    checks every read of the part against it; 0.2's parts carry no checksum)."""
    return f"part-{first_position:012d}-{crc32:08x}.parquet"


def part_bytes(records: list[dict]) -> bytes:
    """The Parquet file of a manifest part, in memory: its checksum goes into its name."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(records_table(records), sink)
    return sink.getvalue().to_pybytes()


@dataclass
class Flush:
    """One piece of work for the committer: rows from ``start`` and the texts they complete."""

    start: int
    pieces: list[np.ndarray]  # the rows, concatenated by the committer (off the compute thread)
    n_rows: int
    records: list[dict]
    ends: np.ndarray  # offsets[first + 1 : first + 1 + len(records)]
    first_position: int


@dataclass
class ShardBuffer:
    """Rows not yet handed to the committer, and the texts they belong to.

    ``start`` is the first buffered row's index in the store (always a shard boundary);
    ``position``/``end`` are the next text's store position and first row."""

    shard_rows: int
    dtype: str
    start: int
    position: int
    end: int
    rows: list[np.ndarray] = field(default_factory=list)
    n_buffered: int = 0
    pending: list[tuple[dict, int]] = field(default_factory=list)  # (record, n_rows), store order

    def append(self, rows: np.ndarray, record: dict) -> Flush | None:
        self.rows.append(rows)
        self.n_buffered += len(rows)
        self.pending.append((record, len(rows)))
        return self.flush(final=False) if self.n_buffered >= self.shard_rows else None

    def flush(self, *, final: bool) -> Flush | None:
        """Whole shards (everything when ``final``) with the texts they complete, or None."""
        count = self.n_buffered if final else (self.n_buffered // self.shard_rows) * self.shard_rows
        if count == 0 and not (final and self.pending):
            return None
        out: list[np.ndarray] = []  # the first ``count`` rows, as pieces (views, no copy here)
        keep: list[np.ndarray] = []
        taken = 0
        for piece in self.rows:
            room = count - taken
            if room >= len(piece):
                out.append(piece)
            elif room > 0:
                out.append(piece[:room])
                keep.append(piece[room:])
            else:
                keep.append(piece)
            taken += min(max(room, 0), len(piece))
        written_end = self.start + count
        records: list[dict] = []
        ends: list[int] = []
        end = self.end
        while self.pending and end + self.pending[0][1] <= written_end:
            record, n_rows = self.pending.pop(0)
            records.append(
                {**record, "position": self.position + len(records), "start": end, "n_rows": n_rows}
            )
            end += n_rows
            ends.append(end)
        flush = Flush(self.start, out, count, records, np.asarray(ends, dtype=np.int64), self.position)
        self.rows = keep
        self.n_buffered -= count
        self.start, self.position, self.end = written_end, self.position + len(records), end
        return flush


class Committer(threading.Thread):
    """Writes flushed shards, manifest parts and offsets, in order, off the compute thread."""

    def __init__(self, group, path: Path) -> None:
        super().__init__(daemon=True, name="layerwise-store-writer")
        self.group, self.path = group, path
        self.jobs: queue.Queue[Flush | None] = queue.Queue(maxsize=2)
        self.shards = ShardFiles.for_array(path / DATA)
        self.positions = group[POSITIONS]
        self.error: BaseException | None = None

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if self.error is None:
                try:
                    self.commit(job)
                except BaseException as exc:  # reported to the main thread
                    self.error = exc

    def submit(self, job: Flush | None) -> None:
        if self.error is not None:
            raise self.error
        if job is not None:
            self.jobs.put(job)

    def close(self) -> None:
        self.jobs.put(None)
        self.join()
        if self.error is not None:
            raise self.error

    def commit(self, job: Flush) -> None:
        data = self.group[DATA]
        end = job.start + job.n_rows
        if end > data.shape[0]:
            data.resize((end, *data.shape[1:]))
        if job.n_rows:
            if self.shards is not None and job.n_rows % self.shards.shard_rows == 0:
                self.shards.write(job.start, job.pieces)  # whole shards: the bytes zarr would write
            else:  # the last, partial shard: zarr pads it
                data[job.start : end] = job.pieces[0] if len(job.pieces) == 1 else np.concatenate(job.pieces)
        if job.records:
            content = part_bytes(job.records)
            part = self.path / MANIFEST / part_name(job.first_position, crc32(content))
            tmp = part.with_name(f".{part.name}.partial")
            try:
                with open(tmp, "wb") as handle:
                    handle.write(content)
                os.replace(tmp, part)
            except BaseException:  # a full disk must not leave the half-written part behind
                tmp.unlink(missing_ok=True)
                raise
            self._write_positions(job)
            marker = self.group[OFFSETS]
            needed = job.first_position + len(job.records) + 1
            if marker.shape[0] < needed:
                marker.resize((needed,))
            marker[job.first_position + 1 : needed] = job.ends  # the commit
        logger.debug(
            "committed rows %d..%d, texts %d..%d",
            job.start,
            end,
            job.first_position,
            job.first_position + len(job.records),
        )

    def _write_positions(self, job: Flush) -> None:
        """``positions[text_id]`` of the texts this commit completes, before the commit marker:
        one read-modify-write of the id range they span (a block or two of input texts)."""
        ids = np.fromiter((r["text_id"] for r in job.records), dtype=np.int64, count=len(job.records))
        lo, hi = int(ids.min()), int(ids.max()) + 1
        span = np.asarray(self.positions[lo:hi])
        span[ids - lo] = np.arange(job.first_position, job.first_position + len(ids))
        self.positions[lo:hi] = span


@dataclass(frozen=True)
class ShardFiles:
    """Whole shards written as files directly, byte for byte what zarr's sharding codec writes for
    this store's layout (inner chunks: plain little-endian bytes, in order; then the index of
    (offset, nbytes) uint64 pairs and its CRC32C, at the end), atomically (temp file + rename, as
    zarr does). Zarr's codec pipeline encodes every inner chunk in Python, holding the GIL that the
    model thread needs; this is one write of the rows' buffer. Used only when the array's metadata
    is exactly that layout (:meth:`for_array`), else zarr writes; a test compares the files."""

    folder: Path
    shard_rows: int
    chunk_rows: int
    dtype: np.dtype
    ndim: int

    @classmethod
    def for_array(cls, folder: Path) -> ShardFiles | None:
        import json

        try:
            meta = json.loads((folder / "zarr.json").read_text(encoding="utf-8"))
            (codec,) = meta["codecs"]
            config = codec["configuration"]
            inner, index = config["codecs"], config["index_codecs"]
            layout_ok = (
                codec["name"] == "sharding_indexed"
                and config["index_location"] == "end"
                and inner == [{"name": "bytes", "configuration": {"endian": "little"}}]
                and index == [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
                and meta["chunk_key_encoding"] == {"name": "default", "configuration": {"separator": "/"}}
                and meta["data_type"] in ("float16", "float32")
                and not meta.get("storage_transformers")
            )
            shard, chunk = meta["chunk_grid"]["configuration"]["chunk_shape"], config["chunk_shape"]
            import google_crc32c  # noqa: F401  (what zarr's crc32c codec uses)
        except (OSError, ValueError, KeyError, TypeError, ImportError):
            return None
        if not layout_ok or shard[1:] != chunk[1:] or shard[0] % chunk[0]:
            return None
        dtype = np.dtype(meta["data_type"]).newbyteorder("<")
        return cls(folder, int(shard[0]), int(chunk[0]), dtype, len(shard))

    def write(self, start: int, pieces: list[np.ndarray]) -> None:
        """Whole shards from ``start`` (a shard boundary): ``pieces`` hold a multiple of
        ``shard_rows`` rows, written piece by piece without joining them first."""
        import uuid

        import google_crc32c

        n_chunks = self.shard_rows // self.chunk_rows
        row_values = int(np.prod(pieces[0].shape[1:]))  # per row; a piece may hold no rows
        chunk_bytes = self.chunk_rows * row_values * self.dtype.itemsize
        index = np.empty((n_chunks, 2), dtype="<u8")
        index[:, 0] = np.arange(n_chunks, dtype=np.uint64) * chunk_bytes
        index[:, 1] = chunk_bytes
        index_bytes = index.tobytes()
        checksum = np.uint32(google_crc32c.value(index_bytes)).astype("<u4").tobytes()
        for k, shard in enumerate(_whole_shards(pieces, self.shard_rows)):
            key = self.folder.joinpath("c", str(start // self.shard_rows + k), *["0"] * (self.ndim - 1))
            key.parent.mkdir(parents=True, exist_ok=True)
            tmp = key.with_name(f"{key.name}.{uuid.uuid4().hex}.partial")  # clean_stale removes these
            try:
                with open(tmp, "wb") as handle:
                    for piece in shard:
                        handle.write(np.ascontiguousarray(piece, dtype=self.dtype).data)
                    handle.write(index_bytes)
                    handle.write(checksum)
                os.replace(tmp, key)
            except BaseException:  # a full disk must not leave a shard-sized temp file behind
                tmp.unlink(missing_ok=True)
                raise


def _whole_shards(pieces: list[np.ndarray], shard_rows: int):
    """The pieces regrouped shard by shard: lists of row slices (views) of ``shard_rows`` rows each."""
    shard: list[np.ndarray] = []
    n = 0
    for piece in pieces:
        while len(piece):
            take = min(shard_rows - n, len(piece))
            shard.append(piece[:take])
            piece, n = piece[take:], n + take
            if n == shard_rows:
                yield shard
                shard, n = [], 0


def clean_stale(path: Path, n_committed: int) -> None:
    """Remove what an interrupted run left past the commit marker: manifest parts and the temp
    files of the manifest's and zarr's atomic writes."""
    for part in (path / MANIFEST).glob("part-*.parquet"):
        with contextlib.suppress(ValueError):
            if int(part.stem.split("-")[1]) >= n_committed:
                part.unlink()
    for leftover in (path / MANIFEST).glob("*.partial"):  # hidden ones, and 0.1's visible ones
        leftover.unlink(missing_ok=True)
    for leftover in (path / MANIFEST).glob(".*.partial"):
        leftover.unlink(missing_ok=True)
    # zarr writes each chunk/shard file as "<key>.<uuid>.partial" and renames it; a SIGKILL between
    # the two leaves the temp file, which zarr never reads (the writer lock is held: none is live)
    for folder in (DATA, OFFSETS, POSITIONS):
        for leftover in (path / folder).rglob("*.partial"):
            leftover.unlink(missing_ok=True)


def disk_error(what: str, path: Path, exc: OSError, kept: str) -> StoreError:
    """A failed write said plainly: ``what`` ("store", "cache") at ``path``, why (the disk is full,
    read-only, …) and ``kept`` (what is safe on disk), with the fix: rerun to resume."""
    reason = {
        errno.ENOSPC: "the disk is full",
        errno.EDQUOT: "the disk quota is exceeded",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.EROFS: "the file system is read-only",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    return StoreError(
        f"writing {what} {str(path)!r} failed: {reason}. {kept}; fix the cause and run the same command "
        "again to resume"
    )
