"""One parser for layer specs.

Hidden-state indices follow Hugging Face: 0 is the embedding output, ``i`` the output of encoder
layer ``i``, so a model with ``L`` layers has ``L + 1`` hidden states. Accepted specs:

    "all"           every hidden state, 0 … L
    3, -1           one index; negative counts from the end (-1 = last layer)
    [0, 4, -1]      several, kept in the order given
    "0,4,-1"        the same as a string (for the command line)
    "0:4", "-4:"    a Python-style range, end excluded: "0:4" = 0, 1, 2, 3
    "last4"         the last N hidden states ("last4" = the BERT paper's "last four layers")
    "embeddings"    index 0
    "0.5", 0.5      a relative depth: a number with a decimal point, 0.0 (embeddings) … 1.0 (the
                    last layer), rounded half up to round(f × L): "0.5" is layer 3 of a 6-layer
                    model and layer 15 of a 30-layer one, so one spec serves models of any depth
    "0.25,0.5,0.75" several depths (and may mix with indices: "0,0.5,-1")

Every accepted spec resolves to a tuple of distinct non-negative indices.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..errors import LayerSpecError

LayerSpec = str | int | float | Sequence[int] | Sequence[float] | Sequence[str]

_RANGE = re.compile(r"^\s*(-?\d+)?\s*:\s*(-?\d+)?\s*$", re.ASCII)
_LAST = re.compile(r"^\s*last\s*(\d+)\s*$", re.IGNORECASE | re.ASCII)
_INT = re.compile(r"^\s*-?\d+\s*$", re.ASCII)
_DEPTH = re.compile(r"^\s*(\d+\.\d*|\.\d+)\s*$", re.ASCII)  # "0.5", ".5", "1.", "1.0"; never a bare int


def _convention(n_hidden_states: int) -> str:
    last = n_hidden_states - 1
    return f"this model has {n_hidden_states} hidden states, 0 = embeddings … {last}; use -1 for the last"


def _check_index(index: int, n_hidden_states: int) -> int:
    if not -n_hidden_states <= index < n_hidden_states:
        raise LayerSpecError(f"layer {index} out of range: {_convention(n_hidden_states)}")
    return index % n_hidden_states


def _depth(value: float, n_hidden_states: int, spec: object) -> int:
    """The hidden state at relative depth ``value`` (0.0 = embeddings, 1.0 = the last layer)."""
    if not 0.0 <= value <= 1.0:  # also refuses NaN
        raise LayerSpecError(
            f"relative depth {spec!r} must lie in 0.0 … 1.0 (0.0 = embeddings, 1.0 = the last layer, "
            f"0.5 = the middle); for an index write a whole number: {_convention(n_hidden_states)}"
        )
    return int(value * (n_hidden_states - 1) + 0.5)  # half up: 0.25 of 6 layers is layer 2


def resolve_layers(spec: LayerSpec, n_hidden_states: int) -> tuple[int, ...]:
    """Resolve ``spec`` to distinct non-negative hidden-state indices for a model with
    ``n_hidden_states`` hidden states (number of layers + 1)."""
    if n_hidden_states < 1:
        raise LayerSpecError(f"n_hidden_states must be >= 1, got {n_hidden_states}")
    if isinstance(spec, bool):
        raise LayerSpecError(f"layer spec {spec!r} is a bool; pass an int, a list of ints or 'all'")
    if isinstance(spec, int):
        return (_check_index(spec, n_hidden_states),)
    if isinstance(spec, float):
        return (_depth(spec, n_hidden_states, spec),)
    if isinstance(spec, str):
        return _resolve_string(spec, n_hidden_states)
    if isinstance(spec, Sequence):
        return _resolve_list(list(spec), n_hidden_states, spec)
    # numpy integers and other int-likes
    if hasattr(spec, "__index__"):
        return (_check_index(int(spec.__index__()), n_hidden_states),)
    raise LayerSpecError(
        f"layer spec {spec!r} of type {type(spec).__name__} is not understood; "
        "use 'all', an int, a list of ints, 'a:b' or 'lastN'"
    )


def _resolve_list(items: list, n_hidden_states: int, original: object) -> tuple[int, ...]:
    if not items:
        raise LayerSpecError("empty layer list; pass at least one layer, or 'all'")
    resolved: list[int] = []
    for item in items:
        if isinstance(item, bool):
            raise LayerSpecError(f"layer {item!r} in {original!r} is a bool, not an index")
        if isinstance(item, float) or (isinstance(item, str) and _DEPTH.match(item)):
            resolved.append(_depth(float(item), n_hidden_states, item))
            continue
        if isinstance(item, str):
            if not _INT.match(item):
                raise LayerSpecError(
                    f"layer {item!r} in {original!r} is neither an index nor a relative depth such as 0.5"
                )
            item = int(item)
        elif not isinstance(item, int):
            if not hasattr(item, "__index__"):
                raise LayerSpecError(f"layer {item!r} in {original!r} is not an integer")
            item = int(item.__index__())
        resolved.append(_check_index(item, n_hidden_states))
    duplicates = sorted({i for i in resolved if resolved.count(i) > 1})
    if duplicates:
        raise LayerSpecError(
            f"layer spec {original!r} names hidden state(s) {duplicates} more than once "
            f"({_convention(n_hidden_states)})"
        )
    return tuple(resolved)


def _resolve_string(spec: str, n_hidden_states: int) -> tuple[int, ...]:
    text = spec.strip().lower()
    if text == "all":
        return tuple(range(n_hidden_states))
    if text in ("embeddings", "embedding"):
        return (0,)
    if _INT.match(text):
        return (_check_index(int(text), n_hidden_states),)
    if _DEPTH.match(text):
        return (_depth(float(text), n_hidden_states, spec),)
    if "," in text:
        parts = [p for p in text.split(",")]
        if any(not p.strip() for p in parts):
            raise LayerSpecError(f"layer list {spec!r} has an empty item; write e.g. '0,4,-1'")
        return _resolve_list([p.strip() for p in parts], n_hidden_states, spec)
    last = _LAST.match(text)
    if last:
        count = int(last.group(1))
        if not 1 <= count <= n_hidden_states:
            raise LayerSpecError(f"{spec!r} asks for {count} hidden states: {_convention(n_hidden_states)}")
        return tuple(range(n_hidden_states - count, n_hidden_states))
    match = _RANGE.match(text)
    if match:
        start_s, stop_s = match.groups()
        start = int(start_s) if start_s is not None else 0
        stop = int(stop_s) if stop_s is not None else n_hidden_states
        # Python slice semantics, but an endpoint beyond the model is a mistake worth reporting.
        for bound in (start, stop):
            if not -n_hidden_states <= bound <= n_hidden_states:
                raise LayerSpecError(
                    f"range {spec!r}: bound {bound} out of range: {_convention(n_hidden_states)}"
                )
        indices = tuple(range(n_hidden_states))[slice(start, stop)]
        if not indices:
            raise LayerSpecError(
                f"range {spec!r} is empty (the end is excluded, as in Python): {_convention(n_hidden_states)}"
            )
        return indices
    raise LayerSpecError(
        f"layer spec {spec!r} is not understood; use 'all', an int such as -1, a list such as "
        "'0,4,-1', a range such as '0:4' (end excluded), 'last4', or a relative depth such as '0.5'"
    )
