"""The store's two entry points, for a store or a sharded store alike: open it, verify it."""

from __future__ import annotations

import os
from pathlib import Path

from ._format import require_store_dependencies
from ._reader import Store
from ._sharded import ShardedStore, is_sharded, shard_report
from ._verify import VerifyReport, verify_one_store


def open_store(path: str | os.PathLike) -> Store:
    """Open a layerwise store for reading; a sharded store (written by ``lw.ray``) reads as one."""
    if is_sharded(path):
        return ShardedStore(path)  # type: ignore[return-value]
    return Store(path)


def verify_store(path: str | os.PathLike, *, block_rows: int = 65536) -> VerifyReport:
    """Check structure and every text's checksum; never raises for damage, reports it. A sharded
    store is checked shard by shard, each against its table (sharded.shard_report)."""
    require_store_dependencies()  # a missing extra is not damage: the pip command, not a traceback
    if is_sharded(Path(path)):
        return shard_report(path)
    return verify_one_store(path, block_rows=block_rows)
