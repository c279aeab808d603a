"""What the readers behind a store's reads (_lookup.py, _layer_view.py) use of the store they serve:
:class:`OpenedStore`, which :class:`reader.Store` is. They see this interface, not the reader's
module, so the reader composes them without either importing the other."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from ..errors import StoreError
    from ._parts import OpenedParts


class OpenedStore(Protocol):
    """One store opened for reading: where it is, its record, its parts (manifest, offsets,
    positions) and data as opened, and why its rows no longer match what was opened, if they don't."""

    path: Path
    meta: dict
    parts: OpenedParts
    lookup: Any  # lookup.TextLookup, serving this store

    @property
    def data(self) -> Any: ...
    @property
    def level(self) -> str: ...
    @property
    def n_rows(self) -> int: ...
    @property
    def n_texts_total(self) -> int: ...
    @property
    def complete(self) -> bool: ...
    def __len__(self) -> int: ...
    def changed_under_us(self) -> StoreError | None: ...
    def committed_in(self, lo: int, hi: int) -> np.ndarray: ...
    def manifest_column_names(self) -> list[str]: ...
    def manifest_rows(self, text_ids: Sequence[int], columns: Sequence[str] | None = None) -> Any: ...
    def array(self, layer: int | None = -1) -> Any: ...
