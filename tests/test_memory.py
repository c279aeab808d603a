"""release_free_memory: glibc's malloc_trim, at most once per interval, across threads."""

from __future__ import annotations

import sys

import pytest

from layerwise._host import memory


def test_trims_at_most_once_per_interval(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(memory, "_malloc_trim", lambda: calls.append)
    monkeypatch.setattr(memory, "_last_trim", 0.0)
    clock = iter([100.0, 100.4, 100.9, 101.1, 101.2])
    monkeypatch.setattr(memory.time, "monotonic", lambda: next(clock))
    for _ in range(5):
        memory.release_free_memory(every=1.0)
    assert calls == [0, 0]  # at 100.0 and 101.1: the calls within a second of a trim do nothing


def test_without_malloc_trim_it_does_nothing(monkeypatch):
    monkeypatch.setattr(memory, "_malloc_trim", lambda: None)
    monkeypatch.setattr(memory, "_last_trim", 0.0)
    memory.release_free_memory(every=0.0)  # no error where the C library has no malloc_trim


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim is Linux-only")
def test_glibc_malloc_trim_is_found_and_returns_memory():
    import ctypes

    memory._malloc_trim.cache_clear()
    trim = memory._malloc_trim()
    if trim is None:
        pytest.skip("this C library has no malloc_trim (musl)")
    # many small blocks freed below a live one at the top of the heap: only a trim returns them
    blocks = [ctypes.create_string_buffer(100_000) for _ in range(2_000)]
    keep = ctypes.create_string_buffer(100)
    del blocks
    assert trim(0) == 1  # 1: memory was given back to the system
    del keep
