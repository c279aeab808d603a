"""inputs/ahead.py: the next block is started on a thread while the caller works on this one."""

from __future__ import annotations

import threading
import time

import pytest

from layerwise._inputs.ahead import ahead


def test_items_come_in_order_with_the_next_one_started_meanwhile():
    started: list[int] = []
    where: set[str] = set()

    def start(item: int) -> int:
        started.append(item)
        where.add(threading.current_thread().name)
        return item * 10

    seen = []
    for item, value in ahead(range(4), start):
        time.sleep(0.05)  # the caller's work: the next item's start runs meanwhile
        assert started[-1] == min(item + 1, 3)  # already started, not waited for
        seen.append((item, value))
    assert seen == [(0, 0), (1, 10), (2, 20), (3, 30)]
    assert all(name.startswith("layerwise-ahead") for name in where)


def test_an_error_comes_at_its_items_turn():
    def start(item: int) -> int:
        if item == 2:
            raise ValueError("bad item 2")
        return item

    seen = []
    with pytest.raises(ValueError, match="bad item 2"):
        for item, _ in ahead(range(5), start):
            seen.append(item)
    assert seen == [0, 1]  # the items before it were handed out first


def test_a_caller_that_stops_early_starts_at_most_one_more():
    started: list[int] = []
    for item, _ in ahead(range(100), started.append):
        if item == 1:
            break
    assert started in ([0, 1], [0, 1, 2])
    assert list(ahead([], started.append)) == []
