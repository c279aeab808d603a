"""A store's parts as they are on disk, read without judging whether they agree (verify.py does):
the committed prefix of the offsets, the committed manifest rows, and the error that says a
store is damaged."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import StoreDamagedError
from .format import MANIFEST, OFFSETS, classify, not_a_store, read_store_meta


def committed_offsets(offsets_array) -> np.ndarray:
    """The valid prefix of the offsets array: entries before the first fill value (-1)."""
    values = offsets_array[:]
    invalid = np.flatnonzero(values < 0)
    return values[: invalid[0]] if invalid.size else values


def read_manifest(path: Path, n_committed: int):
    """The manifest rows of committed texts (a pyarrow Table sorted by position)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = path / MANIFEST
    parts = sorted(p for p in folder.glob("part-*.parquet")) if folder.is_dir() else []
    if not parts:
        return None
    try:
        # ParquetFile, not read_table: that one goes through pyarrow.dataset, which imports pandas
        table = pa.concat_tables([pq.ParquetFile(p).read() for p in parts], promote_options="default")
    except (OSError, pa.ArrowException) as exc:
        raise damaged(path, [f"a manifest part cannot be read ({exc})"], []) from exc
    table = table.sort_by("position")
    # the committed rows are a prefix once sorted (without pyarrow.compute, whose import cost 0.06 s
    # of every `layerwise extract`: this function runs, and returns early, for a new store too)
    committed = int(np.searchsorted(table["position"].to_numpy(), n_committed, side="left"))
    return table.slice(0, committed)


def read_parts(path: Path):
    """``(group, meta, committed offsets, manifest, problems)`` of the store at ``path``, without
    judging whether they agree (see verify.py). Raises NotAStoreError for anything else."""
    import zarr

    if classify(path) != "store":
        raise not_a_store(path) if path.is_dir() else _missing(path)
    meta = read_store_meta(path) or {}
    group = zarr.open_group(str(path), mode="r")
    problems: list[str] = []
    try:
        offsets = committed_offsets(group[OFFSETS])
    except KeyError:
        problems.append(f"the commit marker ({OFFSETS}/) is missing")
        offsets = np.zeros(1, dtype=np.int64)
    except Exception as exc:  # its zarr.json or chunks damaged (not JSON, not UTF-8, cut short)
        problems.append(f"the commit marker ({OFFSETS}/) cannot be read: {type(exc).__name__}: {exc}")
        offsets = np.zeros(1, dtype=np.int64)
    try:
        manifest = read_manifest(path, max(len(offsets) - 1, 0))
    except Exception as exc:  # a damaged part; reported, not raised, by verify
        problems.append(str(exc))
        manifest = None
    return group, meta, offsets, manifest, problems


def _missing(path: Path):
    from ..errors import NotAStoreError

    return NotAStoreError(
        f"{str(path)!r} is not a layerwise store (it does not exist); write one with "
        "layerwise extract INPUT -o corpus.lw"
    )


def damaged(path: Path, problems: list[str], text_ids: list[int]) -> StoreDamagedError:
    hit = (
        f" Texts affected: {', '.join(map(str, text_ids[:10]))}{' …' if len(text_ids) > 10 else ''}."
        if text_ids
        else ""
    )
    return StoreDamagedError(
        f"store {str(path)!r} is damaged: {'; '.join(problems)}.{hit} Its numbers cannot be trusted: "
        f"run 'layerwise verify {path}' for the full list, then rewrite it with --overwrite "
        "(Python: overwrite=True)",
        problems=problems,
        text_ids=text_ids,
    )
