"""Finding and reading committed texts of an opened store, a few at a time: id -> position ->
manifest row and rows, each checked against the others (verify.py says what opening checks)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import StoreDamagedError, StoreError
from ._columns import numbers
from ._format import OFFSETS, POSITIONS
from ._lock import being_rewritten
from ._parts import damaged, settle_zarr_reads
from ._resume import text_sha1
from ._verify import rows_checksum

if TYPE_CHECKING:
    from ._opened import OpenedStore

IDS_AT_ONCE = 4096  # texts read together when slicing or iterating
# the manifest columns each level's results are built from (texts only where the result has them)
RESULT_COLUMNS = {
    "sentence": ("text_id", "position", "start", "n_rows", "crc32"),
    "token": (
        "text_id",
        "position",
        "start",
        "n_rows",
        "crc32",
        "tokens",
        "char_start",
        "char_end",
        "word_ids",
        "segment_ids",
        "text",
        "text_pair",
        "text_sha1",
        "truncated",
        "n_windows",
    ),
    "word": (
        "text_id",
        "position",
        "start",
        "n_rows",
        "crc32",
        "words",
        "char_start",
        "char_end",
        "segment_ids",
        "n_subwords",
        "text",
        "text_pair",
        "text_sha1",
        "words_lost",
    ),
}


def committed_blocks(store) -> Iterator[list[int]]:
    """The committed text ids of ``store`` (a Store or a ShardedStore), ascending, a block of
    IDS_AT_ONCE input ids at a time (a block may hold none)."""
    for lo in range(0, store.n_texts_total, IDS_AT_ONCE):
        yield [int(t) for t in store.committed_in(lo, lo + IDS_AT_ONCE)]


def _close_groups(starts: np.ndarray, stops: np.ndarray, gap: int) -> list[np.ndarray]:
    """Texts (their rows ``starts``/``stops``, in store order) cut where more than ``gap`` rows
    lie between one and the next: each group is read with one zarr read."""
    cuts = np.flatnonzero(starts[1:] - stops[:-1] > gap) + 1
    return np.split(np.arange(len(starts)), cuts)


class TextLookup:
    """The reads behind ``store[i]``, ``read_many``, ``rows`` and ``in`` of one :class:`OpenedStore`."""

    def __init__(self, store: OpenedStore) -> None:
        self.store = store

    def positions(self, text_ids: Sequence[int]) -> np.ndarray:
        """Store positions of ``text_ids``; TypeError/KeyError naming the first bad one."""
        for text_id in text_ids:
            if isinstance(text_id, bool) or not isinstance(text_id, int | np.integer):
                raise TypeError(
                    f"store[{text_id!r}]: a text id is an int (the 0-based input line), "
                    f"not {type(text_id).__name__}"
                )
            if not 0 <= int(text_id) < self.store.n_texts_total:
                raise KeyError(self.absent(text_id))
        ids = np.asarray([int(t) for t in text_ids], dtype=np.int64)
        positions = self.lookup(ids)
        missing = np.flatnonzero(positions < 0)
        if missing.size:
            raise self.store.changed_under_us() or KeyError(self.absent(int(ids[missing[0]])))
        return positions

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """``positions[ids]`` (-1: not committed). The map cannot say "not committed" of a text that
        must be: every text of a store written whole, and every text of the blocks before the last
        commit's (blocks are committed in input order). There it is damage, as is a chunk zarr
        cannot decode."""
        try:
            positions = self.store.parts.positions.lookup(ids) if len(ids) else ids
        except Exception as exc:  # zarr's codecs raise ValueError, RuntimeError (zstd), …
            raise self.positions_unreadable(exc) from exc
        store = self.store
        block = int(store.meta.get("block_size") or 0)
        sure = (
            store.n_texts_total
            if len(store) == store.n_texts_total
            else ((len(store) // block) * block if block > 0 else 0)
        )
        lost = ids[(positions < 0) & (ids < sure)]
        if lost.size:
            raise store.changed_under_us() or damaged(
                store.path,
                [
                    f"{POSITIONS}/ says text {int(lost[0])} is not committed, but it must be "
                    f"({len(store)} of {store.n_texts_total} texts are, in blocks of {block})"
                ],
                [int(t) for t in lost],
            )
        return positions

    def positions_unreadable(self, exc: Exception) -> StoreError:
        """A read of ``positions/`` that failed: another writer's doing, or damage."""
        return self.store.changed_under_us() or damaged(
            self.store.path, [f"{POSITIONS}/ cannot be read ({type(exc).__name__}: {exc})"], []
        )

    def absent(self, text_id) -> str:
        return (
            f"text {text_id!r} is not in the store: {len(self.store)} of {self.store.n_texts_total} texts "
            "are committed (ids are 0-based input lines)"
        )

    def record(self, text_id: int, position: int, columns: tuple[str, ...] | None, strict: bool = True):
        """The manifest row at ``position`` as a dict, checked to be that position's and to name
        ``text_id``. A row that is missing or names another text is damage (``strict``) or, when
        asking whether a text is committed, a no."""
        parts = self.store.parts.manifest
        k = parts.part_of(position)
        try:
            table = parts.read(k, columns) if k >= 0 else None
        except OSError as exc:  # removed, or its bytes differ from its checksum (StoreDamagedError)
            unreadable = self.part_unreadable(parts.names[k], exc, [text_id])
            raise self.store.changed_under_us() or unreadable from exc
        local = position - int(parts.firsts[k]) if k >= 0 else -1
        if table is None or not 0 <= local < table.num_rows:
            if not strict:
                return None
            problem = f"the manifest row of position {position} is missing"
            raise self.store.changed_under_us() or damaged(self.store.path, [problem], [text_id])
        record = {name: table[name][local].as_py() for name in table.column_names}
        if record["position"] != position or record["text_id"] != text_id:
            if not strict:
                return None
            raise self.store.changed_under_us() or damaged(
                self.store.path,
                [f"the manifest row at position {position} names text {record['text_id']}, not {text_id}"],
                [text_id],
            )
        return record

    def part_unreadable(self, name: str, exc: OSError, text_ids: list[int]) -> StoreDamagedError:
        if isinstance(exc, StoreDamagedError):
            return StoreDamagedError(str(exc), problems=exc.problems, text_ids=text_ids)
        return damaged(self.store.path, [f"manifest part {name} cannot be read ({exc})"], text_ids)

    def rows_table(self, text_ids: list[int], columns: tuple[str, ...] | None):
        """The manifest rows of ``text_ids`` as a pyarrow Table: ``take`` on the parts that hold
        them, no Python objects per row (and no pandas import, which ``pa.table`` of lists costs)."""
        import pyarrow as pa

        from ._columns import column

        positions = self.positions(text_ids)
        parts = self.store.parts.manifest
        wanted = None if columns is None else tuple(dict.fromkeys(("text_id", "position", *columns)))
        pieces, k = [], 0
        while k < len(text_ids):  # runs of texts in one part, in the order asked for
            part = parts.part_of(int(positions[k]))
            end = k
            while end < len(text_ids) and parts.part_of(int(positions[end])) == part:
                end += 1
            local = [int(p) - int(parts.firsts[part]) for p in positions[k:end]]
            try:
                table = parts.read(part, wanted)
            except OSError as exc:
                hit = [int(t) for t in text_ids[k:end]]
                unreadable = self.part_unreadable(parts.names[part], exc, hit)
                raise self.store.changed_under_us() or unreadable from exc
            if max(local) >= table.num_rows:  # a row the part lacks: damage, said as one text's read says it
                far = k + int(np.argmax(local))
                self.record(int(text_ids[far]), int(positions[far]), wanted)
            pieces.append(table.take(column(local)))
            k = end
        if not pieces:
            return pa.table({name: column([]) for name in columns or ()})
        result = pa.concat_tables(pieces)
        got_ids, got_positions = numbers(result["text_id"]), numbers(result["position"])
        wrong = np.flatnonzero((got_ids != np.asarray(text_ids)) | (got_positions != positions))
        if wrong.size:  # the same checks and messages as one text's read
            self.record(int(text_ids[wrong[0]]), int(positions[wrong[0]]), wanted)
        return result if columns is None else result.select(list(columns))

    def read(self, text_ids: list[int]) -> list[tuple[dict, np.ndarray]]:
        """``(manifest row, float32 rows)`` of each of ``text_ids``, checked (:meth:`check`). Texts
        whose rows lie close together are read with one zarr read; texts far apart, one per group."""
        positions = self.positions(text_ids)
        if not len(positions):
            return []
        order = np.argsort(positions, kind="stable")
        starts, stops = self.row_spans(positions[order])
        results: list = [None] * len(text_ids)
        columns = RESULT_COLUMNS.get(self.store.level)
        for group in _close_groups(starts, stops, self.gap()):
            lo, hi = int(starts[group[0]]), int(stops[group].max())
            stored = self.read_rows(lo, hi, [text_ids[i] for i in order[group]])
            for j in group:
                i = int(order[j])
                record = self.record(int(text_ids[i]), int(positions[i]), columns)
                rows = stored[int(starts[j]) - lo : int(stops[j]) - lo]
                self.check(record, rows, int(starts[j]), int(stops[j]))
                results[i] = (record, rows.astype(np.float32))
        return results

    def row_spans(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, stops)``: the rows of the texts at ``positions`` (ascending)."""
        lo, hi = int(positions[0]), int(positions[-1])
        if hi - lo <= 4 * len(positions) + 8192:  # one read of the offsets they span
            offsets = self.store.parts.offsets_span(lo, hi + 2)
            return offsets[positions - lo], offsets[positions - lo + 1]
        array = self.store.parts.offsets
        both = np.asarray(array.get_coordinate_selection(np.concatenate([positions, positions + 1])))
        return both[: len(positions)].astype(np.int64), both[len(positions) :].astype(np.int64)

    def gap(self) -> int:
        """Rows between two texts that are cheaper read through than read apart: one shard."""
        return max(
            int(self.store.meta.get("chunk_rows", 128)) * int(self.store.meta.get("shard_chunks", 64)), 1
        )

    def read_rows(self, start: int, stop: int, text_ids: list[int]) -> np.ndarray:
        try:
            return np.asarray(self.store.data[start:stop])
        except (ValueError, FileNotFoundError, RuntimeError) as exc:  # zarr cannot decode the shard
            settle_zarr_reads()
            rewriting = being_rewritten(self.store.path)
            if rewriting is not None:
                raise rewriting from None
            problem = f"rows {start}..{stop - 1} of texts {text_ids[:5]} cannot be read ({exc})"
            raise damaged(self.store.path, [problem], [int(t) for t in text_ids]) from exc

    def check(self, record: dict, rows: np.ndarray, start: int, stop: int) -> None:
        """A text's manifest row agrees with the offsets, and its rows with the checksum written
        at commit: a changed byte is an error, never a wrong number."""
        text_id = int(record["text_id"])
        if record.get("start") != start or record.get("n_rows") != stop - start:
            raise self.store.changed_under_us() or damaged(
                self.store.path,
                [f"the manifest row of text {text_id} disagrees with {OFFSETS} about where its rows are"],
                [text_id],
            )
        if record.get("crc32") is not None and rows_checksum(rows) != record["crc32"]:
            raise self.store.changed_under_us() or damaged(
                self.store.path,
                [f"the rows of text {text_id} differ from the checksum written when it was committed"],
                [text_id],
            )
        digest = record.get("text_sha1")
        text = record.get("text")
        if text is not None and digest is not None and text_sha1(text, record["text_pair"]) != digest:
            problem = f"the text of text {text_id} differs from its text_sha1 in the manifest"
            raise damaged(self.store.path, [problem], [text_id])


class StoreIds(Sequence):
    """The inputs' own ids of a store's committed texts, in input order, read on demand."""

    def __init__(self, store) -> None:
        self._store = store  # a Store or a ShardedStore
        self._column = "id" if "id" in store.manifest_column_names() else "text_id"
        self._before: np.ndarray | None = None  # committed texts before each block of IDS_AT_ONCE ids

    def __len__(self) -> int:
        return len(self._store)

    def _values(self, text_ids: list[int]) -> list:
        return self._store.manifest_rows(text_ids, [self._column])[self._column].to_pylist()

    def __getitem__(self, index):
        if isinstance(index, slice):
            ids = range(*index.indices(len(self)))
            return [v for lo in range(0, len(ids), IDS_AT_ONCE) for v in self[ids[lo : lo + IDS_AT_ONCE]]]
        if isinstance(index, range | list):
            text_ids = self._nth(list(index))
            return self._values(text_ids)
        if not -len(self) <= index < len(self):
            raise IndexError(f"id {index} out of range for {len(self)} committed texts")
        return self._values(self._nth([index % len(self)]))[0]

    def _nth(self, indices: list[int]) -> list[int]:
        """The text ids of the ``indices``-th committed texts. An incomplete store has gaps: a count
        per block of input ids (8 B per 4,096 texts, one pass, renewed when the store's count
        changes) finds each index's block, and only those blocks' ids are read."""
        store = self._store
        if store.complete:
            return indices
        if self._before is None or self._before[-1] != len(store):
            counts = [len(block) for block in committed_blocks(store)]
            self._before = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        blocks = np.searchsorted(self._before, indices, side="right") - 1
        ids_of: dict[int, np.ndarray] = {}
        for block in np.unique(blocks).tolist():
            ids_of[block] = store.committed_in(block * IDS_AT_ONCE, (block + 1) * IDS_AT_ONCE)
        return [int(ids_of[b][i - self._before[b]]) for b, i in zip(blocks.tolist(), indices, strict=True)]

    def __iter__(self):
        for ids in committed_blocks(self._store):
            if ids:
                yield from self._values(ids)
