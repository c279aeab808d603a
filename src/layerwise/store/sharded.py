"""A sharded store: several ordinary stores that read as one (written by ``lw.ray``).

    corpus.lw/
      layerwise-shards.json      format, version, n_texts, the plan and model, and per shard its
                                 folder and its range [start, stop) of global text ids
      shard-00000.lw/            an ordinary store (format.py) holding texts start..stop-1 as ids 0..
      shard-00001.lw/ ...

Each shard is written by exactly one writer with the crash-safe store writer, so each resumes on
its own. ``open_store`` reads a sharded store transparently: ``len``, ``store[i]`` by global id,
iteration in input order, ``array(layer)`` across shards, one manifest.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..errors import NotAStoreError, OptionError, StoreDamagedError
from .format import classify
from .reader import LayerView, Store, StoreDescription
from .verify import VerifyReport

SHARDS_FILE = "layerwise-shards.json"
SHARDS_FORMAT = "layerwise-sharded-store"


def is_sharded(path: str | os.PathLike) -> bool:
    return (Path(path) / SHARDS_FILE).is_file()


def read_shards_meta(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        meta = json.loads((path / SHARDS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreDamagedError(
            f"{path / SHARDS_FILE} cannot be read ({exc}); rerun the command to rewrite it"
        ) from None
    if meta.get("format") != SHARDS_FORMAT:
        raise NotAStoreError(f"{path / SHARDS_FILE} is not a layerwise sharded-store description")
    return meta


def write_shards_meta(path: str | os.PathLike, meta: dict) -> None:
    """Write the description atomically (temp file + rename): a reader sees the old or the new one."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / f".{SHARDS_FILE}.{os.getpid()}.tmp"
    tmp.write_text(
        json.dumps({"format": SHARDS_FORMAT, "format_version": 1, **meta}, indent=1) + "\n", encoding="utf-8"
    )
    os.replace(tmp, path / SHARDS_FILE)


def shard_ranges(n_texts: int, shard_size: int) -> list[tuple[int, int]]:
    if shard_size < 1:
        raise OptionError(f"shard_size={shard_size} must be >= 1")
    return [(start, min(start + shard_size, n_texts)) for start in range(0, n_texts, shard_size)]


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
        return array if dtype is None else array.astype(dtype)


class ShardedStore(StoreDescription):
    """Shards read as one store; text ids are global (0-based input lines)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.refresh()

    def refresh(self) -> None:
        self.meta = read_shards_meta(self.path)
        self._starts = [int(s["start"]) for s in self.meta["shards"]]
        # a shard not begun, or begun but killed before its store existed (only its lock), is None
        self._shards: list[Store | None] = [
            Store(self.path / shard["name"]) if self._begun(shard) else None for shard in self.meta["shards"]
        ]

    def _begun(self, shard: dict) -> bool:
        return classify(self.path / shard["name"]) not in ("missing", "empty")

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

    def __getitem__(self, text_id: int):
        shard, local = self._locate(text_id)
        return shard[local]

    def text_ids(self) -> list[int]:
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
        """Each shard's report, merged; a missing shard is reported too."""
        from .verify import verify_store

        problems: list[str] = []
        damaged_ids: list[int] = []
        n_texts = n_rows = 0
        for start, shard in zip(self._starts, self.meta["shards"], strict=True):
            folder = self.path / shard["name"]
            if not self._begun(shard):
                problems.append(
                    f"shard {shard['name']} (texts {start}..{shard['stop'] - 1}) has not been written"
                )
                continue
            report = verify_store(folder)
            n_texts, n_rows = n_texts + report.n_texts, n_rows + report.n_rows
            problems += [f"{shard['name']}: {p}" for p in report.problems]
            damaged_ids += [start + t for t in report.text_ids]
        return VerifyReport(self.path, n_texts, n_rows, problems, damaged_ids)
