"""Reading a layerwise store: ``open_store(path)``.

Only committed texts are visible: those covered by the valid prefix of the offsets array (see
``format.py``). A store being written can be read at the same time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from ..errors import LayerSpecError, OptionError, StoreError
from ..results import LayerStack, WordVectors
from .format import DATA, read_store_meta, require_store_dependencies
from .lock import being_rewritten
from .parts import damaged, read_parts
from .verify import VerifyReport, check_structure, rows_checksum, verify_one_store


class LayerView:
    """A lazy ``(n_rows, dim)`` view of one layer over every committed row of a store."""

    def __init__(self, data, layer_position: int | None, n_rows: int) -> None:
        self._data, self._layer, self._n = data, layer_position, n_rows
        width = data.shape[-1]
        self.shape = (n_rows, width)
        self.dtype = data.dtype

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, rows) -> np.ndarray:
        if isinstance(rows, slice):
            start, stop, step = rows.indices(self._n)
            rows = slice(start, stop, step)
        elif isinstance(rows, int | np.integer):
            if not -self._n <= rows < self._n:
                raise IndexError(f"row {rows} out of range for {self._n} rows")
            rows = int(rows) % self._n
        else:
            rows = np.asarray(rows)
            if rows.size and (rows.min() < 0 or rows.max() >= self._n):
                raise IndexError(f"rows out of range for {self._n} rows")
        if self._layer is None:
            return np.asarray(self._data[rows])
        if isinstance(rows, np.ndarray):
            return np.asarray(self._data.get_orthogonal_selection((rows, self._layer, slice(None))))
        return np.asarray(self._data[rows, self._layer])

    def iter_chunks(self, rows: int = 8192) -> Iterator[np.ndarray]:
        """Consecutive blocks of rows, for statistics over corpora larger than memory."""
        for start in range(0, self._n, rows):
            yield self[start : min(start + rows, self._n)]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        array = self[0 : self._n]
        return array.astype(dtype) if dtype is not None else array


class StoreDescription:
    """What a store (or a sharded one) says of itself, from its metadata ``meta``."""

    meta: dict

    @property
    def model(self) -> str:
        return self.meta["model"]

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(self.meta["layers"])

    @property
    def level(self) -> str:
        return self.meta["level"]

    @property
    def n_texts_total(self) -> int:
        return int(self.meta.get("n_texts", 0))

    @property
    def complete(self) -> bool:
        return len(self) == self.n_texts_total  # type: ignore[arg-type]


class Store(StoreDescription):
    """A layerwise store opened for reading. ``store[text_id]`` gives the result for one input
    text (a LayerStack, WordVectors or sentence vector, by the store's level)."""

    def __init__(self, path: str | os.PathLike) -> None:
        require_store_dependencies()
        self.path = Path(path)
        self.refresh()

    def refresh(self) -> None:
        """Re-read the commit marker and manifest (to follow a store that is being written).
        Raises StoreDamagedError when they contradict each other or a committed shard is missing,
        and StoreError when that is because another process is rewriting the store (--overwrite)."""
        try:
            group, meta, offsets, manifest, problems = read_parts(self.path)
            if problems:
                raise damaged(self.path, problems, [])
            check_structure(self.path, group, meta, offsets, manifest)
        except (StoreError, KeyError, FileNotFoundError) as exc:
            raise being_rewritten(self.path) or exc from None
        self._group, self.meta, self._offsets, self._manifest = group, dict(meta), offsets, manifest
        self._by_id: dict[int, int] = {}
        if manifest is not None:
            # row p of the sorted manifest is position p (check_structure made sure of it)
            ids = manifest["text_id"].to_numpy()
            self._by_id = {int(t): p for p, t in enumerate(ids)}

    def _changed_under_us(self) -> StoreError | None:
        """Why rows no longer match what was opened, when it is not damage: a writer holds the
        store (``--overwrite`` is rewriting it), or one did and left another store there."""
        rewriting = being_rewritten(self.path)
        if rewriting is not None:
            return rewriting
        if read_store_meta(self.path) != self.meta:
            return StoreError(
                f"store {str(self.path)!r} was rewritten by another process since it was opened; open it "
                "again"
            )
        return None

    def verify(self) -> VerifyReport:
        """Check everything, including each text's checksum; the report names the texts affected."""
        return verify_one_store(self.path)

    @property
    def manifest(self):
        """Committed manifest rows as a pyarrow Table (``.to_pandas()`` for pandas)."""
        return self._manifest

    @property
    def data(self):
        """The raw Zarr array of rows (includes rows past the commit marker after a crash)."""
        try:
            return self._group[DATA]
        except KeyError:  # removed since the store was opened
            raise being_rewritten(self.path) or damaged(self.path, [f"{DATA}/ is missing"], []) from None

    @property
    def n_rows(self) -> int:
        return int(self._offsets[-1]) if len(self._offsets) else 0

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, text_id: object) -> bool:
        return text_id in self._by_id

    def text_ids(self) -> list[int]:
        return sorted(self._by_id)

    def __repr__(self) -> str:
        return (
            f"Store({str(self.path)!r}, model={self.model!r}, level={self.level!r}, layers={self.layers}, "
            f"texts={len(self)}/{self.n_texts_total}, rows={self.n_rows})"
        )

    # --------------------------------------------------------------------------- access
    def rows(self, text_id: int) -> tuple[int, int]:
        """``(start, stop)`` rows of ``text_id`` in :attr:`data`."""
        position = self._position(text_id)
        return int(self._offsets[position]), int(self._offsets[position + 1])

    def _position(self, text_id: int) -> int:
        if isinstance(text_id, bool) or not isinstance(text_id, int | np.integer):
            raise TypeError(
                f"store[{text_id!r}]: a text id is an int (the 0-based input line), "
                f"not {type(text_id).__name__}"
            )
        try:
            return self._by_id[int(text_id)]
        except KeyError:
            raise KeyError(
                f"text {text_id!r} is not in the store: {len(self)} of {self.n_texts_total} texts are "
                "committed (ids are 0-based input lines)"
            ) from None

    def __getitem__(self, text_id: int):
        return self.read_many([text_id])[0]

    def read_many(self, text_ids: Sequence[int]) -> list:
        """The results of ``text_ids``, from one read of the rows they span (a block of texts
        written together is one range of rows: reading it at once costs one zarr read, not many)."""
        positions = [self._position(t) for t in text_ids]
        if not positions:
            return []
        start = min(int(self._offsets[p]) for p in positions)
        stop = max(int(self._offsets[p + 1]) for p in positions)
        try:
            stored = np.asarray(self.data[start:stop])
        except (ValueError, FileNotFoundError) as exc:  # zarr cannot decode the shard: its bytes changed
            rewriting = being_rewritten(self.path)
            if rewriting is not None:
                raise rewriting from None
            problem = f"rows {start}..{stop - 1} of texts {list(text_ids)[:5]} cannot be read ({exc})"
            raise damaged(self.path, [problem], [int(t) for t in text_ids]) from exc
        results = []
        for text_id, position in zip(text_ids, positions, strict=True):
            rows = stored[int(self._offsets[position]) - start : int(self._offsets[position + 1]) - start]
            record = {name: self._manifest[name][position].as_py() for name in self._manifest.column_names}
            # the checksum written at commit: a changed byte is an error, never a wrong number
            if record.get("crc32") is not None and rows_checksum(rows) != record["crc32"]:
                raise self._changed_under_us() or damaged(
                    self.path,
                    [f"the rows of text {text_id} differ from the checksum written when it was committed"],
                    [int(text_id)],
                )
            results.append(self._result(record, rows.astype(np.float32)))
        return results

    def __iter__(self) -> Iterator:
        for _, result in self.items():
            yield result

    def items(self) -> Iterator[tuple[int, object]]:
        """``(text_id, result)`` in input order, reading one text at a time."""
        for text_id in self.text_ids():
            yield text_id, self[text_id]

    def array(self, layer: int | None = -1) -> LayerView:
        """A lazy view of one hidden state (a model index, -1 = last held) over all committed rows.
        For a fused store, ``layer`` must be None."""
        data = self.data
        if data.ndim == 2:
            if layer not in (None, -1):
                raise OptionError("this store holds fused vectors (one per row); use store.array(None)")
            return LayerView(data, None, self.n_rows)
        layers = self.layers
        if layer is None:
            raise OptionError(f"pass one of the store's layers {layers}")
        resolved = layers[layer] if layer < 0 and -len(layers) <= layer else layer
        if resolved not in layers:
            raise LayerSpecError(f"layer {layer} is not in this store; it holds hidden states {layers}")
        return LayerView(data, layers.index(resolved), self.n_rows)

    def _result(self, record: dict, rows: np.ndarray):
        level = self.level
        if level == "sentence":
            return rows[0]
        spans = np.stack([np.asarray(record["char_start"]), np.asarray(record["char_end"])], axis=1).astype(
            np.int32
        )
        if level == "word":
            vectors = rows if rows.ndim == 2 else np.ascontiguousarray(rows.transpose(1, 0, 2))
            return WordVectors(
                vectors=vectors,
                layers=self.layers,
                words=tuple(record["words"]),
                spans=spans.reshape(-1, 2),
                segment_ids=np.asarray(record["segment_ids"], dtype=np.int8),
                n_subwords=np.asarray(record["n_subwords"], dtype=np.int32),
                text=record["text"],
                text_pair=record["text_pair"],
                words_lost=record["words_lost"],
            )
        hidden = np.ascontiguousarray(rows.transpose(1, 0, 2))  # token-major -> (layers, tokens, hidden)
        return LayerStack(
            hidden=hidden,
            layers=self.layers,
            tokens=tuple(record["tokens"]),
            offsets=spans.reshape(-1, 2),
            word_ids=np.asarray(record["word_ids"], dtype=np.int32),
            segment_ids=np.asarray(record["segment_ids"], dtype=np.int8),
            text=record["text"],
            text_pair=record["text_pair"],
            truncated=record["truncated"],
            n_windows=record["n_windows"],
        )
