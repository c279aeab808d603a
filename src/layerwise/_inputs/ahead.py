"""The next block tokenised while this one runs on the model.

``Encoder.iter_results`` tokenises its inputs before it returns and runs the forward lazily, as the
caller reads its results. A writer that goes through a corpus block by block calls it for the next
block on a thread while it reads this block's results: reading the corpus and tokenising it (the
fast tokenizer's batch call releases the GIL) overlap the forward instead of leaving the device idle
between blocks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

Item = TypeVar("Item")
Started = TypeVar("Started")
_END = object()


def ahead(items: Iterable[Item], start: Callable[[Item], Started]) -> Iterator[tuple[Item, Started]]:
    """``(item, start(item))`` in order. The next item is drawn from ``items`` and started on a
    thread while the caller works on this one; an error of either is raised when its item's turn
    comes, after the items before it were handed out.

    The thread is a daemon, one per item, and nothing waits for it at exit: a run stopped by SIGTERM
    or Ctrl-C (which unwinds the caller, not the thread) exits at once instead of joining a thread
    pool at interpreter shutdown (a ThreadPoolExecutor's workers hung such an exit under load)."""
    source = iter(items)

    def begin() -> tuple[threading.Thread, dict]:
        box: dict = {}

        def run() -> None:
            try:
                item = next(source, _END)
                box["value"] = (item, None if item is _END else start(item))  # type: ignore[arg-type]
            except BaseException as exc:  # handed to the caller, at this item's turn
                box["error"] = exc

        thread = threading.Thread(target=run, name="layerwise-ahead", daemon=True)
        thread.start()
        return thread, box

    pending = begin()
    while True:
        thread, box = pending
        thread.join()
        if "error" in box:
            raise box["error"]
        item, started = box["value"]
        if item is _END:
            return
        pending = begin()
        yield item, started
