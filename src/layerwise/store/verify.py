"""Is a store whole? Two levels of checking.

* :func:`check_structure` runs whenever a store is opened, for reading or to resume writing. It
  costs one pass over the manifest's small columns and a directory listing: the manifest has one
  row per committed position and no other, text ids are unique, each row's ``start``/``n_rows``
  equal the offsets, offsets grow and stay within the data, every level's row count matches its
  tokens or words, the data has the shape and dtype of the metadata, and every committed shard
  file exists. Without it a deleted manifest part or data shard silently returned another text's
  vectors or zeros.
* :func:`verify_one_store` (``Store.verify()``, ``layerwise verify``) adds a checksum of every text's
  rows, written at commit time (``crc32`` in the manifest), so changed bytes are found too, and
  names the texts affected.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .format import DATA, OFFSETS
from .parts import damaged, read_parts

_LIST_COLUMN = {"token": "tokens", "word": "words"}


@dataclass
class VerifyReport:
    """What :func:`verify_store` found. ``ok`` when ``problems`` is empty."""

    path: Path
    n_texts: int
    n_rows: int
    problems: list[str] = field(default_factory=list)
    text_ids: list[int] = field(default_factory=list)
    checksums: bool = True

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        if self.ok:
            what = "rows, offsets, manifest, shards" + (" and checksums" if self.checksums else "")
            return f"{self.path}: OK: {self.n_texts} texts, {self.n_rows} rows; {what} agree"
        lines = [f"{self.path}: DAMAGED ({len(self.problems)} problem(s))"]
        lines += [f"  - {p}" for p in self.problems]
        if self.text_ids:
            shown = ", ".join(map(str, self.text_ids[:20])) + (" …" if len(self.text_ids) > 20 else "")
            lines.append(f"  texts affected ({len(self.text_ids)}): {shown}")
        return "\n".join(lines)


def _texts_in_rows(offsets: np.ndarray, text_ids: np.ndarray | None, lo: int, hi: int) -> list[int]:
    """Text ids whose rows overlap ``[lo, hi)``."""
    if text_ids is None or len(offsets) < 2:
        return []
    first = max(int(np.searchsorted(offsets, lo, side="right")) - 1, 0)
    last = int(np.searchsorted(offsets, hi, side="left"))
    return [int(t) for t in text_ids[first : min(last, len(text_ids))]]


def structure_problems(path: Path, group, meta: dict, offsets: np.ndarray, manifest) -> tuple[list, set]:
    """Everything :func:`check_structure` checks, as ``(problems, affected text ids)``."""
    problems: list[str] = []
    affected: set[int] = set()
    try:
        data = group[DATA]
    except KeyError:
        return [f"the data array ({DATA}/) is missing"], affected
    except Exception as exc:  # its zarr.json damaged: not JSON, not UTF-8, not zarr's metadata
        return [
            f"the data array's metadata ({DATA}/zarr.json) cannot be read: {type(exc).__name__}"
        ], affected
    row_shape = tuple(meta.get("row_shape") or ())
    if tuple(data.shape[1:]) != row_shape:
        problems.append(f"data rows have shape {tuple(data.shape[1:])}, the metadata says {row_shape}")
    if str(data.dtype) != meta.get("dtype"):
        problems.append(f"data has dtype {data.dtype}, the metadata says {meta.get('dtype')}")
    if len(offsets) == 0 or offsets[0] != 0:
        problems.append(f"{OFFSETS}[0] is not 0; the commit marker is damaged")
        return problems, affected
    n = len(offsets) - 1
    n_texts = int(meta.get("n_texts", 0))
    if n > n_texts:
        problems.append(f"{n} texts are committed but the store was started for {n_texts}")
    falling = np.flatnonzero(np.diff(offsets) < 0)
    if falling.size:
        problems.append(f"{OFFSETS} decrease at position {int(falling[0]) + 1}; the commit marker is damaged")
    end = int(offsets[-1])
    if end > data.shape[0]:
        problems.append(f"{OFFSETS} point to row {end} but the data array holds {data.shape[0]} rows")

    text_ids: np.ndarray | None = None
    if manifest is None:
        if n:
            problems.append(f"the manifest is missing ({n} texts are committed)")
    else:
        positions = manifest["position"].to_numpy()
        if len(positions) != n or not np.array_equal(positions, np.arange(n)):
            present = set(positions.tolist())
            missing = sorted(set(range(n)) - present)
            duplicated = sorted({int(p) for p in positions[1:][positions[1:] == positions[:-1]]})
            detail = []
            if missing:
                detail.append(f"{len(missing)} positions missing (first {missing[0]})")
            if duplicated:
                detail.append(f"{len(duplicated)} duplicated (first {duplicated[0]})")
                ids = manifest["text_id"].to_numpy()
                affected.update(int(t) for t, p in zip(ids, positions, strict=True) if int(p) in duplicated)
            problems.append(
                f"the manifest has {len(positions)} rows for {n} committed texts ({'; '.join(detail)}); "
                "a manifest part was deleted, copied or changed"
            )
        else:
            text_ids = manifest["text_id"].to_numpy()
            unique, counts = np.unique(text_ids, return_counts=True)
            if (counts > 1).any():
                twice = unique[counts > 1]
                problems.append(
                    f"{len(twice)} text ids appear more than once in the manifest (first {twice[0]})"
                )
                affected.update(int(t) for t in twice)
            out_of_range = text_ids[(text_ids < 0) | (text_ids >= n_texts)]
            if out_of_range.size:
                problems.append(f"text id {int(out_of_range[0])} is outside 0..{n_texts - 1}")
            starts, n_rows = manifest["start"].to_numpy(), manifest["n_rows"].to_numpy()
            bad = np.flatnonzero((starts != offsets[:-1]) | (n_rows != np.diff(offsets)))
            if bad.size:
                problems.append(
                    f"{bad.size} manifest rows disagree with {OFFSETS} about where their rows are "
                    f"(first: text {int(text_ids[bad[0]])})"
                )
                affected.update(int(t) for t in text_ids[bad])
            level = meta.get("level")
            if level in _LIST_COLUMN and _LIST_COLUMN[level] in manifest.column_names:
                import pyarrow.compute as pc

                lengths = pc.list_value_length(manifest[_LIST_COLUMN[level]]).to_numpy(zero_copy_only=False)
                wrong = np.flatnonzero(lengths != n_rows)
                if wrong.size:
                    problems.append(f"{wrong.size} texts have a row count that differs from their {level}s")
                    affected.update(int(t) for t in text_ids[wrong])
            elif level == "sentence" and (n_rows != 1).any():
                problems.append("a sentence store holds more than one row for some texts")

    # every shard that holds committed rows must exist: zarr reads a missing one as fill values
    shard_rows = int(meta.get("chunk_rows", 0)) * int(meta.get("shard_chunks", 0))
    if shard_rows > 0 and end > 0:
        tail = (0,) * (data.ndim - 1)
        for shard in range(-(-min(end, data.shape[0]) // shard_rows)):
            key = data.metadata.encode_chunk_key((shard, *tail))
            if not (path / DATA / key).is_file():
                lo, hi = shard * shard_rows, (shard + 1) * shard_rows
                problems.append(f"data shard {DATA}/{key} (rows {lo}..{hi - 1}) is missing")
                affected.update(_texts_in_rows(offsets, text_ids, lo, hi))
    return problems, affected


def check_structure(path: Path, group, meta: dict, offsets: np.ndarray, manifest) -> None:
    """Raise :class:`StoreDamagedError` naming every inconsistency (see the module docstring)."""
    problems, affected = structure_problems(path, group, meta, offsets, manifest)
    if problems:
        raise damaged(path, problems, sorted(affected))


def rows_checksum(rows: np.ndarray) -> int:
    """CRC-32 of a text's rows as stored (C order, the store's dtype)."""
    return zlib.crc32(np.ascontiguousarray(rows))  # type: ignore[arg-type]  # numpy arrays are buffers


def verify_one_store(path: str | os.PathLike, *, block_rows: int = 65536) -> VerifyReport:
    """Check one (unsharded) store's structure and every text's checksum; never raises for damage,
    reports it. ``layerwise.verify_store`` also takes a sharded store (api.py)."""
    path = Path(path)
    group, meta, offsets, manifest, part_problems = read_parts(path)
    problems, affected = structure_problems(path, group, meta, offsets, manifest)
    problems = part_problems + problems
    n = max(len(offsets) - 1, 0)
    report = VerifyReport(path, n, int(offsets[-1]) if len(offsets) else 0)
    has_checksums = manifest is not None and "crc32" in manifest.column_names
    report.checksums = has_checksums
    if not problems and has_checksums and n:
        data = group[DATA]
        ids = manifest["text_id"].to_numpy()
        expected = manifest["crc32"].to_numpy()
        end = int(offsets[-1])
        shard_rows = int(meta.get("chunk_rows", 0)) * int(meta.get("shard_chunks", 0))
        step = shard_rows or block_rows  # one shard per read, so one bad shard spoils only its own texts
        block_lo, block_len, block = 0, 0, None
        unreadable: list[str] = []
        for position in range(n):
            row, stop = int(offsets[position]), int(offsets[position + 1])
            running, broken = 0, False
            while row < stop:
                if not block_lo <= row < block_lo + block_len:
                    block_lo = (row // step) * step  # whole shards, so one bad shard spoils one block
                    block_len = min(block_lo + step, end) - block_lo
                    try:
                        block = np.asarray(data[block_lo : block_lo + block_len])
                    except Exception as exc:  # zarr raises ValueError for a shard it cannot decode
                        block = None
                        last = block_lo + block_len - 1
                        unreadable.append(f"rows {block_lo}..{last} cannot be read ({exc})")
                take = min(stop, block_lo + block_len) - row
                if block is None:
                    broken = True
                else:
                    part = np.ascontiguousarray(block[row - block_lo : row - block_lo + take])
                    running = zlib.crc32(part, running)  # type: ignore[arg-type]
                row += take
            if broken:
                affected.add(int(ids[position]))
                continue
            if running != int(expected[position]):
                affected.add(int(ids[position]))
        problems.extend(unreadable)
        if affected and not unreadable:
            problems.append(
                f"{len(affected)} texts' rows differ from the checksum written when they were committed"
            )
    report.problems = problems
    report.text_ids = sorted(affected)
    return report


__all__ = ["VerifyReport", "check_structure", "rows_checksum", "verify_one_store"]
