"""The on-disk store: Zarr v3 rows + Parquet manifest + an offsets commit marker (see format.py)."""

from ..errors import NotAStoreError, StoreDamagedError, StoreError
from .api import open_store, verify_store
from .reader import LayerView, Store
from .sharded import ShardedStore
from .verify import VerifyReport
from .writer import StoreSummary, extract_to_store

__all__ = [
    "LayerView",
    "NotAStoreError",
    "ShardedStore",
    "Store",
    "StoreDamagedError",
    "StoreError",
    "StoreSummary",
    "VerifyReport",
    "extract_to_store",
    "open_store",
    "verify_store",
]
