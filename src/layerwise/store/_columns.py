"""Manifest rows -> a pyarrow Table, column by column, from raw buffers.

Two costs this avoids. ``pa.Table.from_pylist`` walks every token of every record in Python while
holding the GIL, which on 2 cores stalled the model thread (0.37 s per 1,000 sentences); building
each column as one array is 20x faster. And ``pa.array`` imports pandas on its first call (pyarrow
checks whether the input is a pandas object): 0.14 s of every ``layerwise extract``'s start-up.
Arrays are built with ``Array.from_buffers`` for the types the manifest holds (int, bool, float,
str, None, lists of those); anything else falls back to ``pa.array``. Tested equal, value for value
and type for type, to ``from_pylist``.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_STRING_BYTES = 2**31 - 1  # pa.string's int32 offsets


def records_table(records: list[dict]) -> Any:
    """The rows as a pyarrow Table: the same table as ``pa.Table.from_pylist(records)``."""
    import pyarrow as pa

    return pa.table({name: column([record[name] for record in records]) for name in records[0]})


def column(values: list) -> Any:
    """``pa.array(values)`` for the manifest's value types, without pyarrow's pandas check."""
    import pyarrow as pa

    first = next((v for v in values if v is not None), None)
    if isinstance(first, list) and all(isinstance(v, list) for v in values):
        flat = list(itertools.chain.from_iterable(values))
        if flat:  # one flat array and the offsets of each record's list
            offsets = np.zeros(len(values) + 1, dtype=np.int32)
            np.cumsum([len(v) for v in values], out=offsets[1:])
            return pa.ListArray.from_arrays(_buffers(pa.int32(), offsets), column(flat))
        return pa.array(values)
    n = len(values)
    present = [v for v in values if v is not None]
    if not present:
        return pa.nulls(n)
    kind = type(first)
    if not all(type(v) is kind for v in present):
        return pa.array(values)  # mixed types: pyarrow's own inference (int + float -> double …)
    validity = None
    if len(present) < n:
        mask = np.fromiter((v is not None for v in values), dtype=bool, count=n)
        validity = pa.py_buffer(np.packbits(mask, bitorder="little"))
    nulls = n - len(present)
    if kind is bool:
        bits = np.packbits(np.fromiter((v is True for v in values), dtype=bool, count=n), bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), n, [validity, pa.py_buffer(bits)], null_count=nulls)
    if kind is int:
        if min(present) < _INT64_MIN or max(present) > _INT64_MAX:
            return pa.array(values)
        data = np.fromiter((0 if v is None else v for v in values), dtype=np.int64, count=n)
        return pa.Array.from_buffers(pa.int64(), n, [validity, pa.py_buffer(data)], null_count=nulls)
    if kind is float:
        data = np.fromiter((0.0 if v is None else v for v in values), dtype=np.float64, count=n)
        return pa.Array.from_buffers(pa.float64(), n, [validity, pa.py_buffer(data)], null_count=nulls)
    if kind is str:
        encoded = [b"" if v is None else v.encode("utf-8") for v in values]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        if offsets[-1] > _MAX_STRING_BYTES:
            return pa.array(values)  # pyarrow splits or widens it
        data = pa.py_buffer(b"".join(encoded))
        buffers = [validity, pa.py_buffer(offsets.astype(np.int32)), data]
        return pa.Array.from_buffers(pa.string(), n, buffers, null_count=nulls)
    return pa.array(values)


def numbers(values: Any) -> np.ndarray:
    """An integer pyarrow column (Array or ChunkedArray, no nulls) as NumPy, from its buffers.
    pyarrow's ``to_numpy`` imports pandas on its first call, zero-copy or not: 0.2 s and 45 MB for
    one store lookup."""
    parts = []
    for chunk in getattr(values, "chunks", [values]):
        if chunk.null_count:
            return np.asarray(values.to_pylist())  # never for the manifest's integer columns
        dtype = np.dtype(str(chunk.type))
        data = chunk.buffers()[1]
        parts.append(np.frombuffer(data, dtype=dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _buffers(kind: Any, data: np.ndarray) -> Any:
    import pyarrow as pa

    return pa.Array.from_buffers(kind, len(data), [None, pa.py_buffer(data)])
