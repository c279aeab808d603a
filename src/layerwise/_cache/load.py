"""``lw.load_cache``: an activation cache as a ``datasets.Dataset``, checked before it is used.

``datasets.load_from_disk`` (and SAELens, which calls it) reads the Arrow files as they are: a
flipped byte in a shard comes back as a number. This reads each shard once, checks its bytes
against the CRC-32 written with it, and the record against its seal, then opens the folder with
``load_from_disk`` (memory-mapped: nothing is held in memory). Cost: one read of the cache,
about 3.7 GB/s of CRC on one core; the page cache keeps it for the reads that follow.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import NotAStoreError
from .format import INFO, META, STATE, cache_damaged, read_meta, require_cache_dependencies, shard_name
from .shards import file_crc32, shard_checksums


def crc_problem(path: Path, name: str, expected: str | None, meta: dict) -> str | None:
    """Why the file ``name`` cannot be trusted against the CRC-32 (hex) written with it, or None.
    A cache of format 1 recorded none: its files are not checked."""
    if not (path / name).is_file():
        return f"{name} is missing"
    if expected is None:
        return f"{name} has no checksum" if meta.get("format_version", 1) >= 2 else None
    if f"{file_crc32(path / name):08x}" != expected:
        return f"{name} differs from the CRC-32 written with it (its bytes changed)"
    return None


def shard_crcs(path: Path, meta: dict) -> list[str | None]:
    """Each shard's recorded CRC-32: the record's, else the files beside the shards."""
    n_shards = int(meta["n_shards"])
    crcs = meta.get("shard_crc32") or shard_checksums(path, n_shards)
    return [crcs[k] if k < len(crcs) else None for k in range(n_shards)]


def check_shards(path: Path, meta: dict) -> None:
    """Every shard's bytes against its CRC-32, and the index files against theirs;
    StoreDamagedError naming the files that differ or lack one."""
    n_shards = int(meta["n_shards"])
    found = [
        crc_problem(path, shard_name(k, n_shards), crc, meta) for k, crc in enumerate(shard_crcs(path, meta))
    ]
    problems = [p for p in found if p is not None] + index_problems(path, meta)
    if problems:
        raise cache_damaged(path, problems)


def index_problems(path: Path, meta: dict) -> list[str]:
    """The index files ``load_from_disk`` reads (which shards, which features) against the CRC-32
    the record holds of them: a changed byte there renames a column or a shard."""
    recorded = meta.get("index_crc32")
    if not isinstance(recorded, dict):
        return (
            ["the record holds no checksum of the index files"] if meta.get("format_version", 1) >= 2 else []
        )
    found = (crc_problem(path, name, recorded.get(name), meta) for name in (INFO, STATE))
    return [problem for problem in found if problem is not None]


def load_cache(path: str | os.PathLike, *, check: bool = True) -> Any:
    """The activation cache at ``path`` as a ``datasets.Dataset`` (columns: one per hook, and
    ``token_ids``), its record and shards checked first (module docstring); ``check=False`` skips
    the shards' read (the record is always checked): their bytes are then not compared with their
    checksums, so verify the cache once (``layerwise verify``) before loading it so.
    StoreDamagedError when anything differs, NotAStoreError when ``path`` is not a finished cache."""
    require_cache_dependencies()
    path = Path(path)
    meta = read_meta(path)
    if meta is None:
        raise NotAStoreError(
            f"{str(path)!r} is not a layerwise activation cache (no {META}); make one with "
            "layerwise cache CORPUS -o FOLDER"
        )
    finished = "index_crc32" in meta or meta.get("format_version", 1) < 2
    if "n_shards" not in meta or not (path / STATE).is_file() or not (path / INFO).is_file() or not finished:
        raise NotAStoreError(
            f"cache {str(path)!r} is not finished: rerun the command that made it, it resumes"
        )
    if check:
        check_shards(path, meta)
    else:  # the record is always checked, and the index files are small
        problems = index_problems(path, meta)
        if problems:
            raise cache_damaged(path, problems)
    from datasets import load_from_disk

    return load_from_disk(str(path))
