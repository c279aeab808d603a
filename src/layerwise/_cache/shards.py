"""One shard of the cache as the Arrow IPC stream ``Dataset.save_to_disk`` writes, and the index
files (``dataset_info.json``, ``state.json``) that make the folder a dataset.

The columns are built from the activations' own buffers, without a copy: an ``Array2D`` column's
storage is ``list<list<dtype>>``, so its values are the ``(B, T, H)`` array flattened and its two
offsets arrays are arithmetic; ``token_ids`` is a fixed-size list of int32. ``pa.array`` on the
same data walks every row in Python. A record batch holds at most 2^30 values per column (Arrow's
int32 list offsets); a shard file stays far below 2 GB (writer.SHARD_BYTES).
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..store._checksum import crc32
from .format import INFO, STATE, TOKEN_IDS, checksum_name, shard_name, write_json, write_text_atomically

_MAX_VALUES = 2**30


def _array2d(kind: Any, values: np.ndarray) -> Any:
    """An ``Array2D`` extension array over ``values`` ``(B, T, H)`` (zero-copy)."""
    import pyarrow as pa

    b, t, h = values.shape
    flat = pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), b * t * h, [None, pa.py_buffer(values)])
    inner = pa.ListArray.from_arrays(pa.array(np.arange(0, (b * t + 1) * h, h, dtype=np.int32)), flat)
    outer = pa.ListArray.from_arrays(pa.array(np.arange(0, (b + 1) * t, t, dtype=np.int32)), inner)
    return pa.ExtensionArray.from_storage(kind, outer)


def record_batch(schema: Any, arrays: dict[str, np.ndarray], token_ids: np.ndarray) -> Any:
    import pyarrow as pa

    columns = []
    for field in schema:
        if field.name == TOKEN_IDS:
            ids = np.ascontiguousarray(token_ids, dtype=np.int32)
            flat = pa.Array.from_buffers(pa.int32(), ids.size, [None, pa.py_buffer(ids)])
            columns.append(pa.FixedSizeListArray.from_arrays(flat, ids.shape[1]))
        else:
            columns.append(_array2d(field.type, np.ascontiguousarray(arrays[field.name])))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class _Checksummed(io.RawIOBase):
    """A file written through, with the CRC-32 of every byte that passed."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.crc32 = handle, 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.crc32 = crc32(data, self.crc32)
        return self.handle.write(data)


def write_shard(
    path: Path, name: str, features: Any, arrays: dict[str, np.ndarray], token_ids: np.ndarray
) -> None:
    """Write one shard file whole: a hidden temp file, fsync, rename (a crash leaves no shard).
    Its CRC-32, taken as the bytes are written, goes to its checksum file first (format.py)."""
    import pyarrow as pa

    schema = features.arrow_schema
    n, per_row = len(token_ids), max(a[0].size for a in arrays.values()) if arrays else 1
    step = max(1, _MAX_VALUES // max(per_row, 1))
    tmp = path / f".{name}.partial"
    try:
        with open(tmp, "wb") as handle:
            sink = _Checksummed(handle)
            with pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), schema) as writer:
                for lo in range(0, n, step):
                    part = {k: v[lo : lo + step] for k, v in arrays.items()}
                    writer.write_batch(record_batch(schema, part, token_ids[lo : lo + step]))
            handle.flush()
            os.fsync(handle.fileno())
        write_text_atomically(path / checksum_name(name), f"{sink.crc32:08x}\n")
        os.replace(tmp, path / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def file_crc32(path: Path) -> int:
    """CRC-32 of a file's bytes, read 16 MiB at a time."""
    crc = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            crc = crc32(block, crc)
    return crc


def shard_checksums(path: Path, n_shards: int) -> list[str | None]:
    """Each shard's CRC-32 (hex) from its checksum file, None where there is none."""
    found: list[str | None] = []
    for k in range(n_shards):
        try:
            found.append((path / checksum_name(shard_name(k, n_shards))).read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            found.append(None)
    return found


def write_dataset_index(path: Path, features: Any, n_shards: int, contexts_sha256: str) -> None:
    """``dataset_info.json`` (the features, by ``datasets``' own writer) and ``state.json`` (the
    shard files, in order), as ``Dataset.save_to_disk`` leaves them; ``state.json`` last."""
    from datasets import DatasetInfo

    with tempfile.TemporaryDirectory(dir=path, prefix=".info-") as scratch:
        DatasetInfo(features=features).write_to_directory(scratch)
        os.replace(Path(scratch) / INFO, path / INFO)
    state: dict[str, object] = {
        "_data_files": [{"filename": shard_name(k, n_shards)} for k in range(n_shards)],
        # datasets' cache key for this data: the same contexts and settings give the same one
        "_fingerprint": hashlib.sha256(f"{contexts_sha256}:{features.to_dict()}".encode()).hexdigest()[:16],
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    write_json(path / STATE, state)
