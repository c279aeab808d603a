"""The next block tokenised while this one runs on the model.

``Encoder.iter_results`` tokenises its inputs before it returns and runs the forward lazily, as the
caller reads its results. A writer that goes through a corpus block by block calls it for the next
block on a thread while it reads this block's results: reading the corpus and tokenising it (the
fast tokenizer's batch call releases the GIL) overlap the forward instead of leaving the device idle
between blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

Item = TypeVar("Item")
Started = TypeVar("Started")
_END = object()


def ahead(items: Iterable[Item], start: Callable[[Item], Started]) -> Iterator[tuple[Item, Started]]:
    """``(item, start(item))`` in order. The next item is drawn from ``items`` and started on one
    thread while the caller works on this one; an error of either is raised when its item's turn
    comes, after the items before it were handed out."""
    source = iter(items)

    def begin() -> tuple[object, object]:
        item = next(source, _END)
        return item, (None if item is _END else start(item))  # type: ignore[arg-type]

    with ThreadPoolExecutor(1, thread_name_prefix="layerwise-ahead") as pool:
        pending = pool.submit(begin)
        try:
            while True:
                item, started = pending.result()
                if item is _END:
                    return
                pending = pool.submit(begin)
                yield item, started  # type: ignore[misc]
        finally:
            pending.cancel()  # the caller stopped: the next item is not started if it has not begun
