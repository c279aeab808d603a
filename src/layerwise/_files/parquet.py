"""Pooled results as Parquet: one row per input, one row group per block, read by pandas, polars,
DuckDB and ``datasets`` with no layerwise installed.

    id           int64 or string: the --id-column value (without one, the input's 0-based row)
    text         string (dropped with --no-text); text_pair when the inputs are pairs
    n_tokens     int32: tokens the model saw (after truncation, or over all windows)
    truncated    bool
    words        list<string> (word level): the words, in order; words_lost int32
    layer_{i}    fixed_size_list<float32|float16, dim>: hidden state i (0 = the embedding output)
                 (word level: a list of them, one per word)
    fused_{name} the same, for a fusion (its layers are in the metadata)

The schema's metadata ``layerwise`` holds the model, the weights' hash, the plan and the version.
Token-level output has one row per token of every layer: it belongs in a store or an .npz.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .._results import WordVectors
from ..errors import MissingDependencyError, OptionError
from .blocks import Contents, Result, Writer


def check_parquet_plan(level: str) -> None:
    if level == "token":
        raise OptionError(
            "Parquet output holds pooled vectors, one row per input: pass --pool sentence:MODE or "
            "word:MODE; token-level vectors (every layer of every token) go to a store (-o out.lw) or .npz"
        )


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet
    except ModuleNotFoundError as exc:
        if exc.name != "pyarrow":  # pyarrow is there but something it needs is not: say that
            raise
        raise MissingDependencyError("Parquet output needs pyarrow: pip install 'layerwise[io]'") from exc
    return pa


def vector_columns(meta: dict) -> list[str]:
    """The names of the vector columns for a plan's metadata."""
    if meta.get("fuse"):
        return [f"fused_{meta['fuse']}"]
    return [f"layer_{i}" for i in meta["layers"]]


class ParquetWriter(Writer):
    def __init__(self, target, meta, dtype, contents: Contents) -> None:
        super().__init__(target, meta, dtype, contents)
        self.pa = _pyarrow()
        check_parquet_plan(meta["level"])
        self.word_level = meta["level"] == "word"
        self.columns = vector_columns(meta)
        self.rows: list[tuple[Result, int] | None] = []
        self.writer: Any = None

    def begin(self, block) -> None:
        super().begin(block)
        self.rows = [None] * len(block)

    def put(self, index: int, result: Result, n_tokens: int, empty: bool = False) -> None:
        super().put(index, result, n_tokens, empty)
        assert self.block is not None
        self.rows[index - self.block.start] = (result, n_tokens)

    def end_block(self) -> None:
        super().end_block()
        block = self.block
        assert block is not None
        if not len(block):
            return
        table = self._table(block, [r for r in self.rows if r is not None])
        if self.writer is None:
            import pyarrow.parquet as pq

            schema = table.schema.with_metadata({"layerwise": json.dumps(self.meta)})
            # vectors have no repeats to find: no dictionary; snappy costs little where nothing shrinks
            self.writer = pq.ParquetWriter(
                str(self.target), schema, compression="snappy", use_dictionary=False
            )
        self.writer.write_table(table.replace_schema_metadata(self.writer.schema.metadata))
        self.rows = []

    def _table(self, block, rows: list[tuple[Result, int]]) -> Any:
        pa = self.pa
        columns: dict[str, Any] = {
            "id": pa.array(block.ids, type=pa.int64() if self.id_kind == "int" else pa.string()),
        }
        if self.keep_text:
            columns["text"] = pa.array(block.texts, type=pa.string())
            if block.text_pairs is not None:
                columns["text_pair"] = pa.array(block.text_pairs, type=pa.string())
        columns["n_tokens"] = pa.array([n for _, n in rows], type=pa.int32())
        results = [r for r, _ in rows]
        if self.word_level:
            words = [r.words for r in results if isinstance(r, WordVectors)]
            columns["words"] = pa.array(words, type=pa.list_(pa.string()))
            columns["words_lost"] = pa.array([r.words_lost for r in results], type=pa.int32())  # type: ignore[union-attr]
            columns["truncated"] = pa.array([r.words_lost > 0 for r in results], type=pa.bool_())  # type: ignore[union-attr]
        else:
            columns["truncated"] = pa.array([r.truncated for r in results], type=pa.bool_())  # type: ignore[union-attr]
        for k, name in enumerate(self.columns):
            columns[name] = self._vectors(results, k)
        return pa.table(columns)

    def _vectors(self, results: list[Result], k: int) -> Any:
        """Column ``k`` of the vector columns: hidden state k, or the fusion."""
        pa = self.pa
        fused = bool(self.meta.get("fuse"))
        if not self.word_level:
            stacked = np.stack([r.vector if fused else r.vector[k] for r in results])  # type: ignore[union-attr]
            return _fixed_lists(pa, stacked.astype(self.dtype, copy=False))
        per_text = [r.vectors if fused else r.vectors[k] for r in results]  # type: ignore[union-attr]
        width = per_text[0].shape[-1]
        flat = np.concatenate([v.reshape(-1, width) for v in per_text]).astype(self.dtype, copy=False)
        offsets = np.zeros(len(per_text) + 1, dtype=np.int32)
        np.cumsum([len(v) for v in per_text], out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets), _fixed_lists(pa, flat))

    def finish(self) -> dict:
        summary = self.summary()
        if self.writer is None:  # no texts: an empty file with the schema still says what it is
            self.begin_empty()
        self.writer.close()
        self.writer = None
        return summary

    def begin_empty(self) -> None:
        import pyarrow.parquet as pq

        pa = self.pa
        fields = [pa.field("id", pa.int64() if self.id_kind == "int" else pa.string())]
        schema = pa.schema(fields, metadata={"layerwise": json.dumps(self.meta)})
        self.writer = pq.ParquetWriter(str(self.target), schema)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _fixed_lists(pa: Any, matrix: np.ndarray) -> Any:
    """``(n, dim)`` → a fixed_size_list<float, dim> array (no copy of the values)."""
    values = pa.array(np.ascontiguousarray(matrix).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(values, matrix.shape[-1])


def read_parquet_meta(path: str | Path) -> dict:
    """The ``layerwise`` metadata of a Parquet file this module wrote."""
    import pyarrow.parquet as pq

    metadata = pq.read_schema(path).metadata or {}
    return json.loads(metadata.get(b"layerwise", b"{}"))
