"""The on-disk store: Zarr v3 rows + Parquet manifest + an offsets commit marker (see format.py)."""

from .reader import LayerView, Store, open_store
from .writer import StoreError, StoreSummary, extract_to_store

__all__ = ["LayerView", "Store", "StoreError", "StoreSummary", "extract_to_store", "open_store"]
