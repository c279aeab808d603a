"""Is an activation cache whole? ``layerwise verify acts/`` and ``lw.cache.verify_cache``.

Checks, shard by shard (memory: one record batch): the record (its seal); the contexts file's
size and SHA-256; every shard present, its bytes against the CRC-32 written with it, with the
cache's schema and its rows' count; each row's
``token_ids`` equal to the context its slot holds (``contexts[permutation[slot]]``: the shuffle
and the placement, proven from the data); every activation finite; and, once complete, the index
files ``load_from_disk`` needs.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import StoreDamagedError
from ..store._verify import VerifyReport
from .contexts import read_contexts
from .format import (
    CACHE_ENTRIES,
    CONTEXTS,
    INFO,
    META,
    STATE,
    TOKEN_IDS,
    features,
    lost_its_record,
    read_meta,
    require_cache_dependencies,
    shard_name,
)
from .load import crc_problem, index_problems, shard_crcs


class CacheReport(VerifyReport):
    """A :class:`VerifyReport` of a cache: ``n_texts`` counts contexts, ``n_rows`` tokens."""

    def __str__(self) -> str:
        if self.ok:
            return (
                f"{self.path}: OK: {self.n_texts} contexts, {self.n_rows} tokens; record, contexts, "
                "shards and token ids agree"
            )
        return super().__str__().replace("texts affected", "context slots affected")


def verify_cache(path: str | os.PathLike) -> VerifyReport:
    """Check everything (module docstring); never raises for damage, reports it. ``n_texts`` of
    the report counts contexts, ``n_rows`` tokens; ``text_ids`` names the bad contexts' slots."""
    require_cache_dependencies()  # a missing extra is not damage: the pip command, not a traceback
    from .writer import permutation

    path = Path(path)
    try:
        meta = read_meta(path)
    except StoreDamagedError as exc:  # the record cannot be read, or was changed
        return CacheReport(path, 0, 0, list(exc.problems))
    if meta is None and lost_its_record(path):
        entries = ", ".join(n for n in CACHE_ENTRIES if (path / n).exists())
        return CacheReport(
            path,
            0,
            0,
            [
                f"its record, {META}, is missing (the folder holds a cache's {entries}): what "
                "made it, and every shard's checksum, are lost"
            ],
        )
    if meta is None or "n_contexts" not in meta:
        what = "has no record" if meta is None else "was stopped before its token pass ended"
        return CacheReport(
            path, 0, 0, [f"{str(path)!r} is not a complete layerwise activation cache (it {what})"]
        )
    n, context, per_shard = meta["n_contexts"], meta["context"], meta["shard_contexts"]
    report = CacheReport(path, n, n * context)
    problems, bad = report.problems, report.text_ids
    changed_contexts = _contexts_problem(path, meta)
    if changed_contexts is not None:
        problems.append(changed_contexts)
        return report
    order = permutation(n, meta["shuffle_seed"])
    schema = features({c: meta["d_model"] for c in meta["columns"]}, context, meta["dtype"]).arrow_schema
    missing: list[str] = []
    unchecked: list[int] = []  # the slots of shards whose bytes changed
    for k, crc in enumerate(shard_crcs(path, meta)):
        name = shard_name(k, meta["n_shards"])
        lo, hi = k * per_shard, min((k + 1) * per_shard, n)
        if not (path / name).exists():
            missing.append(name)
            continue
        changed = crc_problem(path, name, crc, meta)
        if changed is not None:
            problems.append(changed)
            unchecked += list(range(lo, hi))
            continue
        found, wrong = _shard_problems(path / name, range(lo, hi), schema, meta, order)
        problems += found
        bad += wrong
    problems += _completion_problems(path, meta, missing)
    if bad:
        problems.append(
            f"{len(bad)} contexts hold other token ids than their slot's context (first slot {bad[0]})"
        )
    report.text_ids = sorted(set(bad) | set(unchecked))
    return report


def _contexts_problem(path: Path, meta: dict) -> str | None:
    """What is wrong with the token contexts the cache was computed from: their size or their
    SHA-256 against the record; None when they are as recorded."""
    file, expected = path / CONTEXTS, meta["n_contexts"] * meta["context"] * 4
    size = file.stat().st_size if file.exists() else -1
    if size != expected:
        return f"{CONTEXTS} holds {max(size, 0)} bytes, the record says {expected}"
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 24), b""):
            digest.update(chunk)
    if digest.hexdigest() != meta["contexts_sha256"]:
        return f"{CONTEXTS} differs from the contexts the cache was computed from (SHA-256)"
    return None


def _shard_problems(
    file: Path, slots: range, schema: Any, meta: dict, order: np.ndarray
) -> tuple[list[str], list[int]]:
    """``(problems, wrong slots)`` of a shard whose bytes are as recorded, read: its schema, its row
    count, its values finite, and each context's token ids against its slot's."""
    import pyarrow as pa

    context, name = meta["context"], file.name
    problems: list[str] = []
    bad: list[int] = []
    try:
        slot = slots.start
        with pa.memory_map(str(file)) as source:
            reader = pa.ipc.open_stream(source)
            if not reader.schema.equals(schema):
                return [f"{name} has another schema than the cache's"], []
            for batch in reader:
                rows = batch.num_rows
                ids = batch.column(TOKEN_IDS).flatten().to_numpy().reshape(rows, context)
                want = read_contexts(file.parent / CONTEXTS, context, order[slot : slot + rows])
                wrong = np.flatnonzero((ids != want).any(axis=1)) if len(want) == rows else np.arange(rows)
                bad += [int(slot + w) for w in wrong]
                for column in meta["columns"]:
                    values = batch.column(column).storage.flatten().flatten().to_numpy(zero_copy_only=False)
                    if not np.isfinite(values).all():
                        problems.append(f"{name}: column {column} holds NaN or inf")
                slot += rows
        if slot != slots.stop:
            problems.append(f"{name} holds {slot - slots.start} contexts, the record says {len(slots)}")
    except (OSError, pa.ArrowException) as exc:
        problems.append(f"{name} cannot be read ({exc})")
    return problems, bad


def _completion_problems(path: Path, meta: dict, missing: list[str]) -> list[str]:
    """Shards not yet written, a missing state or info file, else the index's own problems."""
    if missing:
        return [
            f"{len(missing)} of {meta['n_shards']} shards are not written yet (first {missing[0]}): "
            "rerun the command that made the cache, it resumes"
        ]
    if (
        not (path / STATE).exists()
        or not (path / INFO).exists()
        or ("index_crc32" not in meta and meta.get("format_version", 1) >= 2)
    ):
        return [f"{STATE} or {INFO} is missing: rerun the command that made the cache to finish it"]
    return index_problems(path, meta)
