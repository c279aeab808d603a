"""A sharded store: several ordinary stores that read as one (written by ``lw.ray``).

The layout, the table and the identity every shard records are in _shard_table.py. Each shard is
written by exactly one writer with the crash-safe store writer, so each resumes on its own.
``open_store`` reads a sharded store transparently: ``len``, ``store[i]`` by global id, iteration in
input order, ``array(layer)`` across shards, one manifest; and it opens only shards that belong
(the table checked, each shard's identity, model, weights and plan compared with it).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._results import to_dtype
from ..errors import OptionError, StoreDamagedError
from ._format import OFFSETS, classify, damaged, read_store_meta
from ._reader import LayerView, Store, StoreDescription
from ._shard_table import is_sharded, read_table, shard_name, shard_path, shard_problems, texts_sha256
from ._verify import VerifyReport, verify_one_store

__all__ = [
    "ShardProgress",
    "ShardedLayerView",
    "ShardedStore",
    "is_sharded",
    "shard_progress",
    "shard_report",
]


def _damaged(root: Path, problems: list[str]) -> StoreDamagedError:
    return damaged(root, problems, [], "sharded store")


def _begun(folder: Path) -> bool:
    """A shard not begun, or begun but killed before its store existed (only its lock), is not."""
    return classify(folder) not in ("missing", "empty")


def _belonging(table: dict, index: int, folder: Path) -> tuple[dict, list[str]]:
    """The shard's metadata (read once) and what makes it not belong to ``table`` (none: it does)."""
    meta = read_store_meta(folder)
    if meta is None:
        return {}, [f"{shard_name(index)} is not a layerwise store"]
    return meta, shard_problems(table, index, meta)


def _one_model(named_metas: list[tuple[str, dict]]) -> list[str]:
    """The shards of one store were computed by one model: their weights' hashes agree.
    ``named_metas``: each shard's folder name and metadata, in shard order."""
    first_by_hash: dict[str, str] = {}
    for name, meta in named_metas:
        first_by_hash.setdefault(str(meta.get("weights_sha256")), name)
    if len(first_by_hash) < 2:
        return []
    first, other = list(first_by_hash.values())[:2]
    return [f"{other} was computed with other weights than {first} (weights_sha256 differ)"]


@dataclass(frozen=True)
class ShardProgress:
    """How far a sharded store's writing has come: the shards still to write, and the committed
    texts and rows of all shards."""

    pending: list[int]
    n_texts: int
    n_rows: int


def shard_progress(root: str | os.PathLike) -> ShardProgress:
    """The shards of ``root`` still to write and what is committed, from the table, each shard's
    metadata and its commit marker (the offsets array) alone. No manifest is read, so the cost does
    not grow with the texts: opening the store reads every shard's manifest, texts included (about
    400 bytes a text), which for 2M texts took the Ray driver from 0.5 to 1.1 GB. Shards that do
    not belong, or of different weights, raise StoreDamagedError as when opening the store."""
    import zarr

    from ._parts import committed_prefix

    root = Path(root)
    table = read_table(root)
    problems: list[str] = []
    pending: list[int] = []
    n_texts = n_rows = 0
    metas: list[tuple[str, dict]] = []
    for k, shard in enumerate(table["shards"]):
        folder = shard_path(root, shard["name"])
        if not _begun(folder):
            pending.append(k)
            continue
        meta, belonging = _belonging(table, k, folder)
        if belonging:
            problems += belonging
            continue
        metas.append((shard["name"], meta))
        try:
            committed, end = committed_prefix(zarr.open_array(str(folder / OFFSETS), mode="r"), meta)
        except (FileNotFoundError, KeyError, ValueError):
            committed, end = 0, 0  # begun, killed before its first commit
        committed = max(committed, 0)
        n_texts += committed
        n_rows += end
        if committed < shard["stop"] - shard["start"]:
            pending.append(k)
    problems += _one_model(metas)
    if problems:
        raise _damaged(root, problems)
    return ShardProgress(pending, n_texts, n_rows)


class ShardedLayerView:
    """One hidden state over the committed rows of every shard, in input order, read lazily."""

    def __init__(self, views: list[LayerView]) -> None:
        self._views = views
        self._starts = np.cumsum([0] + [len(v) for v in views])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, rows) -> np.ndarray:
        if isinstance(rows, slice):
            start, stop, step = rows.indices(len(self))
            if step != 1:
                return self[np.arange(start, stop, step)]
            parts = []
            for k, view in enumerate(self._views):
                lo, hi = max(start, self._starts[k]), min(stop, self._starts[k + 1])
                if lo < hi:
                    parts.append(view[int(lo - self._starts[k]) : int(hi - self._starts[k])])
            return np.concatenate(parts) if parts else self._views[0][0:0]
        index = np.asarray(rows)
        if index.ndim == 0:
            k = int(np.searchsorted(self._starts, int(index), side="right") - 1)
            return self._views[k][int(index) - int(self._starts[k])]
        return np.stack([self[int(i)] for i in index])

    def iter_chunks(self, rows: int = 8192) -> Iterator[np.ndarray]:
        for view in self._views:
            yield from view.iter_chunks(rows)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        array = self[:]
        return array if dtype is None else to_dtype(array, dtype, "the rows read")


class ShardedStore(StoreDescription):
    """Shards read as one store; text ids are global (0-based input lines)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.refresh()

    def refresh(self) -> None:
        """Re-read the table and open every begun shard, checking that each belongs (its identity,
        model, weights and plan agree with the table): a StoreDamagedError names those that do not."""
        self.meta = read_table(self.path)
        self._starts = [int(s["start"]) for s in self.meta["shards"]]
        folders = [shard_path(self.path, s["name"]) for s in self.meta["shards"]]
        problems: list[str] = []
        for k, folder in enumerate(folders):
            if _begun(folder):
                problems += _belonging(self.meta, k, folder)[1]
        if problems:
            raise _damaged(self.path, problems)
        self._shards: list[Store | None] = [Store(f) if _begun(f) else None for f in folders]
        problems = _one_model([(shard.path.name, shard.meta) for shard in self._present()])
        if problems:
            raise _damaged(self.path, problems)

    def pending_shards(self) -> list[int]:
        """Indices of the shards not yet written completely (what a resumed run must still do)."""
        return [k for k, shard in enumerate(self._shards) if shard is None or not shard.complete]

    @property
    def n_shards(self) -> int:
        return len(self._starts)

    @property
    def n_rows(self) -> int:
        return sum(s.n_rows for s in self._present())

    def __len__(self) -> int:
        return sum(len(s) for s in self._present())

    def __repr__(self) -> str:
        return (
            f"ShardedStore({str(self.path)!r}, model={self.model!r}, level={self.level!r}, "
            f"layers={self.layers}, texts={len(self)}/{self.n_texts_total}, shards={self.n_shards})"
        )

    def _present(self) -> list[Store]:
        return [s for s in self._shards if s is not None]

    def _locate(self, text_id: int) -> tuple[Store, int]:
        if isinstance(text_id, bool) or not isinstance(text_id, int | np.integer):
            raise TypeError(f"store[{text_id!r}]: a text id is an int (the 0-based input line)")
        if not 0 <= int(text_id) < self.n_texts_total:
            raise KeyError(f"text {text_id!r} is not in the store: it holds ids 0..{self.n_texts_total - 1}")
        k = bisect.bisect_right(self._starts, int(text_id)) - 1
        shard = self._shards[k]
        local = int(text_id) - self._starts[k]
        if shard is None or local not in shard:
            raise KeyError(f"text {text_id} is not committed yet (shard {self.meta['shards'][k]['name']})")
        return shard, local

    def __contains__(self, text_id: object) -> bool:
        try:
            self._locate(text_id)  # type: ignore[arg-type]
        except (KeyError, TypeError):
            return False
        return True

    def __getitem__(self, key):
        if isinstance(key, slice):
            ids = range(*key.indices(self.n_texts_total))
            return [r for lo in range(0, len(ids), 4096) for r in self.read_many(list(ids[lo : lo + 4096]))]
        shard, local = self._locate(key)
        return shard[local]

    def committed_in(self, lo: int, hi: int) -> np.ndarray:
        """The committed global text ids in ``lo .. hi - 1``, ascending."""
        found = []
        for start, stop, shard in zip(self._starts, self._stops(), self._shards, strict=True):
            if shard is not None and start < hi and lo < stop:
                found.append(start + shard.committed_in(max(lo - start, 0), min(hi, stop) - start))
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def _stops(self) -> list[int]:
        return [*self._starts[1:], self.n_texts_total]

    def manifest_column_names(self) -> list[str]:
        present = self._present()
        return present[0].manifest_column_names() if present else []

    def manifest_rows(self, text_ids: Sequence[int], columns: Sequence[str] | None = None):
        """The manifest rows of ``text_ids`` (global ids, in that order), ``text_id`` global."""
        import pyarrow as pa
        import pyarrow.compute as pc

        tables: list[tuple[Store, int, list[int]]] = []
        for text_id in text_ids:  # consecutive ids of one shard are read together
            shard, local = self._locate(text_id)
            if tables and tables[-1][0] is shard:
                tables[-1][2].append(local)
            else:
                tables.append((shard, int(text_id) - local, [local]))
        pieces = []
        for shard, start, locals_ in tables:
            table = shard.manifest_rows(locals_, columns)
            if "text_id" in table.column_names:
                index = table.column_names.index("text_id")
                table = table.set_column(index, "text_id", pc.add(table["text_id"], start))
            pieces.append(table)
        return pa.concat_tables(pieces) if pieces else pa.table({c: [] for c in columns or []})

    @property
    def ids(self):
        """The inputs' own ids of the committed texts in input order, read on demand."""
        from ._lookup import StoreIds

        return StoreIds(self)

    def read_many(self, text_ids: Sequence[int]) -> list:
        """The results of ``text_ids``: one read per shard they fall in (see Store.read_many)."""
        located = [self._locate(t) for t in text_ids]
        results: list = []
        k = 0
        while k < len(located):
            shard = located[k][0]
            run = k
            while run < len(located) and located[run][0] is shard:
                run += 1
            results += shard.read_many([local for _, local in located[k:run]])
            k = run
        return results

    def text_ids(self) -> list[int]:
        """Every committed global text id, ascending (a list as long as the store)."""
        return [
            start + i
            for start, shard in zip(self._starts, self._shards, strict=True)
            if shard
            for i in shard.text_ids()
        ]

    def items(self) -> Iterator[tuple[int, object]]:
        for start, shard in zip(self._starts, self._shards, strict=True):
            if shard is not None:
                for local, result in shard.items():
                    yield start + local, result

    def __iter__(self) -> Iterator:
        for _, result in self.items():
            yield result

    def array(self, layer: int | None = -1) -> ShardedLayerView:
        present = self._present()
        if not present:
            raise OptionError(f"{self.path} holds no committed text yet")
        return ShardedLayerView([s.array(layer) for s in present])

    @property
    def manifest(self):
        """Every shard's committed manifest rows, with global text ids, as one pyarrow Table."""
        import pyarrow as pa
        import pyarrow.compute as pc

        tables = []
        for start, shard in zip(self._starts, self._shards, strict=True):
            if shard is not None and shard.manifest is not None:
                table = shard.manifest
                index = table.column_names.index("text_id")
                tables.append(table.set_column(index, "text_id", pc.add(table["text_id"], start)))
        return pa.concat_tables(tables) if tables else None

    def verify(self) -> VerifyReport:
        """Every shard checked against the table and then on its own, merged into one report."""
        return shard_report(self.path)


def shard_report(root: str | os.PathLike) -> VerifyReport:
    """Check a sharded store: the table (a malformed one raises StoreDamagedError), each shard's
    identity, model and plan against it, the texts each complete shard holds against the table's
    hash, one model's weights across shards, and each shard as an ordinary store (structure and
    checksums). A shard's damage is reported, never raised."""

    root = Path(root)
    table = read_table(root)
    problems: list[str] = []
    damaged_ids: list[int] = []
    n_texts = n_rows = 0
    weights: dict[str, str] = {}
    for k, shard in enumerate(table["shards"]):
        folder = shard_path(root, shard["name"])
        start, stop = shard["start"], shard["stop"]
        if not _begun(folder):
            problems.append(f"shard {shard['name']} (texts {start}..{stop - 1}) has not been written")
            continue
        meta, belonging = _belonging(table, k, folder)
        if belonging:
            problems += belonging
            damaged_ids += range(start, stop)
            continue
        weights.setdefault(str(meta.get("weights_sha256")), shard["name"])
        report = verify_one_store(folder)
        n_texts, n_rows = n_texts + report.n_texts, n_rows + report.n_rows
        problems += [f"{shard['name']}: {p}" for p in report.problems]
        damaged_ids += [start + t for t in report.text_ids]
        if report.ok and report.n_texts == stop - start:
            # the texts the shard holds, read from its own manifest, against the table's hash
            texts, pairs = _texts_in_order(Store(folder), bool(meta.get("pairs")))
            if texts_sha256(texts, pairs) != shard["texts_sha256"]:
                problems.append(
                    f"{shard['name']} holds other texts than the table says (texts_sha256 differ)"
                )
                damaged_ids += range(start, stop)
    if len(weights) > 1:
        names = ", ".join(weights.values())
        problems.append(
            f"the shards were computed by {len(weights)} different models (first shards: {names})"
        )
    return VerifyReport(root, n_texts, n_rows, problems, sorted(set(damaged_ids)))


def _texts_in_order(store: Store, pairs: bool):
    """``(texts, second segments or None)`` of a complete store in input order, as two iterators
    that read the manifest a few thousand texts at a time (for :func:`texts_sha256`)."""
    import itertools

    def rows():
        for lo in range(0, len(store), 4096):
            table = store.manifest_rows(range(lo, min(lo + 4096, len(store))), ["text", "text_pair"])
            yield from zip(table["text"].to_pylist(), table["text_pair"].to_pylist(), strict=True)

    if not pairs:
        return (t for t, _ in rows()), None
    first, second = itertools.tee(rows())  # read in step: tee keeps one row between them
    return (t for t, _ in first), (p for _, p in second)
