"""What layerwise learns about a model object, kept beside it, never on it: a model a user passes in
(or reaches through ``Encoder.model``) keeps exactly the attributes it had.

Each note is keyed by the model object and goes with it (a weak reference): the final norm settled
at load (final_norm.py), the weights its checkpoint lacked and the hash of its weights
(loading/weights_hash.py), the streamed weights behind a skeleton (streaming/model.py). A replica
of a model (forward/replica.py: new modules around the same weights) reads and writes its model's
notes.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_notes: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


# a replica's model, weakly both ways: a replica keeps nothing alive through this table
_originals: weakref.WeakKeyDictionary[Any, weakref.ref] = weakref.WeakKeyDictionary()


def note_replica(replica: Any, model: Any) -> None:
    """``replica`` is a copy of ``model`` around its weights: its notes are ``model``'s."""
    with _lock:
        _originals[replica] = _originals.get(model) or weakref.ref(model)


def _owner(model: Any) -> Any:
    original = _originals.get(model)
    found = None if original is None else original()
    return model if found is None else found


def note(model: Any, key: str, value: Any) -> None:
    """Remember ``value`` as ``key`` of ``model``."""
    with _lock:
        _notes.setdefault(_owner(model), {})[key] = value


def noted(model: Any, key: str, default: Any = None) -> Any:
    """What was noted as ``key`` of ``model``, or ``default``."""
    with _lock:
        return _notes.get(_owner(model), {}).get(key, default)
