"""What layerwise learns about a model object, kept beside it, never on it: a model a user passes in
(or reaches through ``Encoder.model``) keeps exactly the attributes it had.

Each note is keyed by the model object and goes with it (a weak reference): the final norm settled
at load (final_norm.py), the weights its checkpoint lacked and the hash of its weights
(loading/weights_hash.py), the streamed weights behind a skeleton (streaming/model.py).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_notes: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def note(model: Any, key: str, value: Any) -> None:
    """Remember ``value`` as ``key`` of ``model``."""
    with _lock:
        _notes.setdefault(model, {})[key] = value


def noted(model: Any, key: str, default: Any = None) -> Any:
    """What was noted as ``key`` of ``model``, or ``default``."""
    with _lock:
        return _notes.get(model, {}).get(key, default)
