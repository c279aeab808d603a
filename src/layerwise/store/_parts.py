"""A store's parts as they are on disk, opened without judging whether they agree (verify.py
does): the commit marker's valid length, the manifest parts, the id -> position map, and the error
that says a store is damaged. Nothing here reads per-text data whole (_index.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._format import OFFSETS, POSITIONS, classify, damaged, not_a_store, read_store_meta
from ._index import IdPositions, ManifestParts, committed_count


def commit_window(meta: dict) -> int | None:
    """The most texts one commit writes: a flush holds at most one shard's rows of texts, each at
    least one row, plus the one that crossed the boundary (commit.ShardBuffer)."""
    shard_rows = int(meta.get("chunk_rows", 0) or 0) * int(meta.get("shard_chunks", 0) or 0)
    return shard_rows + 1 if shard_rows > 0 else None


def committed_prefix(offsets_array, meta: dict) -> tuple[int, int]:
    """``(committed texts, one past their last row)`` from the commit marker, read a few chunks at
    a time (:func:`index.committed_count`); ``(-1, 0)`` when even ``offsets[0]`` is unwritten."""
    n_valid = committed_count(offsets_array, commit_window(meta))
    return n_valid - 1, int(offsets_array[n_valid - 1]) if n_valid else 0


@dataclass
class OpenedParts:
    """What opening a store reads: constant in the number of texts."""

    path: Path
    group: Any
    meta: dict
    offsets: Any  # the zarr array (None when missing or unreadable)
    n_valid: int  # valid offsets entries = committed texts + 1 (0 when the marker is unusable)
    manifest: ManifestParts
    positions: IdPositions
    problems: list[str] = field(default_factory=list)

    @property
    def n_committed(self) -> int:
        return max(self.n_valid - 1, 0)

    def offsets_span(self, lo: int, hi: int) -> np.ndarray:
        """``offsets[lo:hi]`` (within the valid prefix)."""
        if self.offsets is None or hi <= lo:
            return np.zeros(0, dtype=np.int64)
        return np.asarray(self.offsets[lo:hi], dtype=np.int64)

    end: int = 0  # one past the last committed row, as opened


def open_parts(path: Path) -> OpenedParts:
    """Open the store at ``path`` (raises NotAStoreError for anything else); problems with its
    commit marker or manifest listing are collected, not raised."""

    if classify(path) != "store":
        raise not_a_store(path, reading=True) if path.is_dir() else _missing(path)
    meta = read_store_meta(path) or {}
    group = open_root(path, "r")
    problems: list[str] = []
    offsets: Any = None
    n_valid = 0
    try:
        offsets = group[OFFSETS]
        n_valid = committed_count(offsets, commit_window(meta))
    except KeyError:
        problems.append(f"the commit marker ({OFFSETS}/) is missing")
    except Exception as exc:  # its zarr.json or chunks damaged (not JSON, not UTF-8, cut short)
        offsets = None
        problems.append(f"the commit marker ({OFFSETS}/) cannot be read: {type(exc).__name__}: {exc}")
    manifest = ManifestParts(path, max(n_valid - 1, 0))
    problems += manifest.problems
    try:
        positions_array = group[POSITIONS]
    except KeyError:  # a store written before the map existed: built from the manifest if asked
        positions_array = None
    except Exception as exc:  # its zarr.json damaged
        positions_array = None
        what = type(exc).__name__
        problems.append(f"the id -> position map ({POSITIONS}/zarr.json) cannot be read ({what})")
    positions = IdPositions(positions_array, manifest, int(meta.get("n_texts", 0)))
    end = int(offsets[n_valid - 1]) if offsets is not None and n_valid else 0
    return OpenedParts(path, group, meta, offsets, n_valid, manifest, positions, problems, end)


def open_root(path: Path, mode: str) -> Any:
    """The store's root zarr group, or StoreDamagedError naming its root metadata when zarr cannot
    read it as a group (a key renamed, a type changed, a field removed, "group" made "array")."""
    import zarr

    try:
        return zarr.open_group(str(path), mode=mode)  # type: ignore[arg-type]
    except Exception as exc:  # zarr's TypeError, ContainsArrayError, ValueError, JSON errors …
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        problem = (
            f"its root metadata ({path / 'zarr.json'}) is not a zarr group's: {type(exc).__name__}: {detail}"
        )
        raise damaged(path, [problem], []) from None


def read_manifest(path: Path, n_committed: int, columns: tuple[str, ...] | None = None):
    """The manifest rows of committed texts, whole (a pyarrow Table sorted by position), or None.
    Costs the whole manifest: readers go through :class:`index.ManifestParts` instead."""
    import pyarrow as pa

    parts = ManifestParts(path, n_committed)
    if not len(parts):
        return None
    try:
        tables = [table for _, table in parts.iter_tables(columns)]
        table = pa.concat_tables(tables, promote_options="default")
    except (OSError, pa.ArrowException) as exc:
        raise damaged(path, [f"a manifest part cannot be read ({exc})"], []) from exc
    return table


def _missing(path: Path):
    from ..errors import NotAStoreError

    return NotAStoreError(
        f"{str(path)!r} is not a layerwise store (it does not exist); write one with "
        "layerwise extract INPUT -o corpus.lw"
    )


def settle_zarr_reads() -> None:
    """After a failed zarr read, let the chunk reads it started beside the failing one finish on
    zarr's event loop: left pending, they print pages of "Task was destroyed but it is pending!"
    and "Event loop is closed" when the process exits."""
    import asyncio

    async def finish_others() -> None:
        current = asyncio.current_task()
        others = [task for task in asyncio.all_tasks() if task is not current]
        if others:
            await asyncio.wait(others, timeout=10)

    try:
        from zarr.core.sync import sync

        sync(finish_others())
    except Exception:  # nothing to settle, or another zarr: the noise is only noise
        pass
