"""Per-input units through the forward: an input, or the windows of a long one. Each batch's rows
become each input's :class:`~layerwise.LayerStack`; a long input's windows are stitched back once
all of them are done (_inputs/windows.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._host.progress import progress_bar
from .._inputs.block import EncodedInput, TokenColumns
from .._inputs.windows import Window, plan_windows
from .._results import LayerStack
from ..errors import OptionError
from .call import Call
from .rows import Rows, check_overflow, make_stack, nonfinite_error, stitch_stack, warn_nonfinite


@dataclass(frozen=True)
class Units:
    """The units of a call's inputs: ``units`` in order, each one's ``owners`` entry ``(input
    index, window number or -1)``, and how many windows each long input has (``n_windows``)."""

    encoded: list[EncodedInput]
    units: list[EncodedInput | Window]
    owners: list[tuple[int, int]]
    n_windows: dict[int, int]


def planned_units(encoded: list[EncodedInput], call: Call, max_length: int, *, causal: bool) -> Units:
    """Each input as it is, or its windows when it is longer than ``max_length`` (a causal model's
    keep each token's left context: _inputs/windows.py)."""
    units: list[EncodedInput | Window] = []
    owners: list[tuple[int, int]] = []  # per unit: (input index, window number or -1)
    n_windows: dict[int, int] = {}
    for item in encoded:
        if len(item) <= max_length:
            units.append(item)
            owners.append((item.index, -1))
            continue
        if "attention_probs" in call.taps:
            raise OptionError(
                f"attention_probs cannot be stitched across windows (input {item.index} has "
                f"{len(item)} tokens > {max_length}); use long_texts='truncate' for attention maps"
            )
        windows = plan_windows(item, max_length, call.stride, causal=causal)
        n_windows[item.index] = len(windows)
        for k, window in enumerate(windows):
            units.append(window)
            owners.append((item.index, k))
    return Units(encoded, units, owners, n_windows)


def unit_jobs(
    units: list[Any], batches: list[list[int]], packed: bool
) -> Iterator[tuple[list[int], Callable]]:
    """Each batch's unit indices and what its forward reads: the units' columns (packed) or the
    units themselves (the padded forward collates them)."""
    for batch_ids in batches:
        picked = [units[u] for u in batch_ids]
        if packed:
            yield batch_ids, lambda picked=picked: TokenColumns.of_units(picked)
        else:
            yield batch_ids, lambda picked=picked: picked


def unit_stacks(
    planned: Units,
    batch_rows: Iterable[tuple[list[int], Rows]],
    call: Call,
    *,
    allow_nan: bool,
    quiet: bool,
    progress: bool | None,
) -> Iterator[tuple[int, LayerStack]]:
    """``(input index, LayerStack)`` from each batch's ``(unit indices, Rows)``, as batches finish."""
    layers, owners, units = call.layers, planned.owners, planned.units
    by_index = {item.index: item for item in planned.encoded}
    bar = None if quiet else progress_bar("extracting", "inputs", progress)
    task = bar.add_task("extract", total=len(units)) if bar is not None else None
    pending: dict[int, dict[int, tuple]] = {}  # windows of long inputs until all are done
    nonfinite: list[int] = []  # inputs whose vectors hold NaN or inf
    with bar if bar is not None else nullcontext():
        for batch_ids, rows in batch_rows:
            if rows.overflows:
                check_overflow(rows, [owners[u][0] for u in batch_ids], layers)
            for u, (hidden, tapped) in zip(batch_ids, rows, strict=True):
                index, k = owners[u]
                if rows.nonfinite and not np.isfinite(hidden).all():
                    if not allow_nan:
                        raise nonfinite_error(index, by_index[index].text, hidden, layers)
                    nonfinite.append(index)
                if k < 0:  # pooled on the device: the rows are the input's pooled vectors
                    pooled = None if call.device_pool is None else hidden[:, 0] if call.sentence else hidden
                    yield index, make_stack(by_index[index], hidden, tapped, layers, pooled=pooled)
                    continue
                pending.setdefault(index, {})[k] = (units[u], hidden, tapped)
                if len(pending[index]) == planned.n_windows[index]:
                    yield index, stitch_stack(by_index[index], pending.pop(index), layers)
            if bar is not None and task is not None:
                bar.advance(task, len(batch_ids))
    if nonfinite:
        warn_nonfinite(nonfinite)
