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
import logging
import os
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .format import DATA, MANIFEST, OFFSETS

logger = logging.getLogger("layerwise")


def part_name(first_position: int) -> str:
    return f"part-{first_position:012d}.parquet"


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
        import pyarrow as pa
        import pyarrow.parquet as pq

        data = self.group[DATA]
        end = job.start + job.n_rows
        if end > data.shape[0]:
            data.resize((end, *data.shape[1:]))
        if job.n_rows:
            data[job.start : end] = job.pieces[0] if len(job.pieces) == 1 else np.concatenate(job.pieces)
        if job.records:
            part = self.path / MANIFEST / part_name(job.first_position)
            tmp = part.with_name(f".{part.name}.partial")
            pq.write_table(pa.Table.from_pylist(job.records), tmp)
            os.replace(tmp, part)
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
    for folder in (DATA, OFFSETS):
        for leftover in (path / folder).rglob("*.partial"):
            leftover.unlink(missing_ok=True)
