"""Reading a layerwise store: ``open_store(path)``.

Only committed texts are visible: those covered by the valid prefix of the offsets array (see
``format.py``). A store being written can be read at the same time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from .._results import LayerStack, WordVectors, units_from_names
from ..errors import LayerSpecError, OptionError, StoreError
from ._format import DATA, read_store_meta, require_store_dependencies
from ._layer_view import LayerView
from ._lock import being_rewritten
from ._lookup import IDS_AT_ONCE, StoreIds, TextLookup, committed_blocks
from ._parts import damaged, open_parts, read_manifest
from ._verify import VerifyReport, layout_problems, verify_one_store


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
    text (a LayerStack, WordVectors or sentence vector, by the store's level); ``store[a:b]`` a
    list of them. Opening reads nothing per text: each access reads the manifest rows, offsets
    and data rows it needs (_index.py), so memory does not grow with the store."""

    def __init__(self, path: str | os.PathLike) -> None:
        require_store_dependencies()
        self.path = Path(path)
        self.refresh()

    def refresh(self) -> None:
        """Re-read the commit marker and the manifest's listing (to follow a store that is being
        written). Raises StoreDamagedError when the layout is damaged (verify.layout_problems), and
        StoreError when that is because another process is rewriting the store (--overwrite)."""
        try:
            opened = open_parts(self.path)
            problems, _, _ = layout_problems(opened)
            if problems:
                raise damaged(self.path, problems, [])
        except (StoreError, KeyError, FileNotFoundError) as exc:
            raise being_rewritten(self.path) or exc from None
        self.parts, self._group, self.meta = opened, opened.group, dict(opened.meta)
        self.lookup = TextLookup(self)

    def changed_under_us(self) -> StoreError | None:
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
        """Committed manifest rows as a pyarrow Table (``.to_pandas()`` for pandas), in store
        order. Reads every part: for one column of some texts use :meth:`manifest_rows`."""
        return read_manifest(self.path, len(self))

    def manifest_rows(self, text_ids: Sequence[int], columns: Sequence[str] | None = None):
        """The manifest rows of ``text_ids`` (in that order) as a pyarrow Table, reading only the
        parts that hold them and only ``columns`` (all when None)."""
        return self.lookup.rows_table(list(text_ids), None if columns is None else tuple(columns))

    @property
    def data(self):
        """The raw Zarr array of rows, unchecked: no checksum is compared, and rows past the commit
        marker (after a crash) are included. For code that reads Zarr itself; ``store[i]`` and
        ``store.array`` check every read, and ``layerwise verify`` checks the whole store."""
        try:
            return self._group[DATA]
        except KeyError:  # removed since the store was opened
            raise being_rewritten(self.path) or damaged(self.path, [f"{DATA}/ is missing"], []) from None

    @property
    def n_rows(self) -> int:
        return self.parts.end

    def __len__(self) -> int:
        return self.parts.n_committed

    def __contains__(self, text_id: object) -> bool:
        if isinstance(text_id, bool) or not isinstance(text_id, int | np.integer):
            return False
        if not 0 <= int(text_id) < self.n_texts_total:
            return False
        position = int(self.lookup.lookup(np.asarray([int(text_id)], dtype=np.int64))[0])
        return (
            position >= 0
            and self.lookup.record(int(text_id), position, ("text_id", "position"), strict=False) is not None
        )

    def text_ids(self) -> list[int]:
        """Every committed text id, ascending (a list as long as the store)."""
        if self.complete:
            return list(range(len(self)))
        return [text_id for block in committed_blocks(self) for text_id in block]

    def committed_in(self, lo: int, hi: int) -> np.ndarray:
        """The committed text ids in ``lo .. hi - 1``, ascending."""
        hi = min(hi, self.n_texts_total)
        if self.complete:
            return np.arange(lo, hi)
        try:
            return self.parts.positions.committed_ids(lo, hi)
        except Exception as exc:  # zarr's codecs raise ValueError, RuntimeError (zstd), …
            raise self.lookup.positions_unreadable(exc) from exc

    def manifest_column_names(self) -> list[str]:
        return self.parts.manifest.column_names()

    @property
    def ids(self) -> StoreIds:
        """The inputs' own ids (``--id-column``, else the 0-based input line) of the committed
        texts in input order: a lazy sequence (``len``, index, slice, iteration) that reads the
        manifest a part at a time."""
        return StoreIds(self)

    def __repr__(self) -> str:
        return (
            f"Store({str(self.path)!r}, model={self.model!r}, level={self.level!r}, layers={self.layers}, "
            f"texts={len(self)}/{self.n_texts_total}, rows={self.n_rows})"
        )

    # --------------------------------------------------------------------------- access
    def rows(self, text_id: int) -> tuple[int, int]:
        """``(start, stop)`` rows of ``text_id`` in :attr:`data`."""
        position = int(self.lookup.positions([text_id])[0])
        start, stop = self.parts.offsets_span(position, position + 2)
        return int(start), int(stop)

    def __getitem__(self, key):
        if isinstance(key, slice):
            return [result for chunk in self._slice_chunks(key) for result in self.read_many(chunk)]
        return self.read_many([key])[0]

    def _slice_chunks(self, key: slice):
        ids = range(*key.indices(self.n_texts_total))
        for lo in range(0, len(ids), IDS_AT_ONCE):
            yield list(ids[lo : lo + IDS_AT_ONCE])

    def read_many(self, text_ids: Sequence[int]) -> list:
        """The results of ``text_ids``. Texts whose rows lie close together (a block of texts
        written together) are read with one zarr read; texts far apart, one read per group."""
        return [self._result(record, rows) for record, rows in self.lookup.read(list(text_ids))]

    def __iter__(self) -> Iterator:
        for _, result in self.items():
            yield result

    def items(self) -> Iterator[tuple[int, object]]:
        """``(text_id, result)`` in input order, reading a few thousand texts at a time."""
        for ids in committed_blocks(self):
            yield from zip(ids, self.read_many(ids), strict=True)

    def array(self, layer: int | None = -1) -> LayerView:
        """A lazy view of one hidden state (a model index, -1 = last held) over all committed rows.
        For a fused store, ``layer`` must be None."""
        data = self.data
        if data.ndim == 2:
            if layer not in (None, -1):
                raise OptionError("this store holds fused vectors (one per row); use store.array(None)")
            return LayerView(self, None)
        layers = self.layers
        if layer is None:
            raise OptionError(f"pass one of the store's layers {layers}")
        resolved = layers[layer] if layer < 0 and -len(layers) <= layer else layer
        if resolved not in layers:
            raise LayerSpecError(f"layer {layer} is not in this store; it holds hidden states {layers}")
        return LayerView(self, layers.index(resolved))

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
            units=units_from_names(tuple(record["tokens"]), record["text"], self.meta),
        )
