"""The on-disk store: Zarr v3 rows + Parquet manifest + an offsets commit marker (see format.py)."""

from ..errors import NotAStoreError, StoreDamagedError, StoreError
from ._api import open_store, verify_store
from ._extract_to_store import extract_to_store
from ._reader import LayerView, Store
from ._sharded import ShardedStore
from ._verify import VerifyReport
from ._writer import StoreSummary

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
