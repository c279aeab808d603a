"""Giving freed memory back to the system during a long extraction (glibc's ``malloc_trim``).

A forward pass allocates and frees large, short-lived buffers (hidden states, attention scores:
0.1 to 30 MB each). glibc's dynamic mmap threshold rises to the size of each freed mmap'd block,
so after the first batches these buffers come from the heap, and freed heap memory that is not at
the top of the heap stays in the process: without a trim, the RSS of a sentence-level extraction
climbs for minutes (default model, 2 cores: 1.6 GB at one minute, 1.9 GB at four). A
``malloc_trim(0)`` at most every TRIM_EVERY_S seconds gives the free pages back: the file and
store writers call it as results come.

Measured on 30,000 texts to sentence-level Parquet in one process, alternating, two rounds
(``benchmarks/corpus_io.py --part trim``): median RSS of each run's second half 1,563 MiB without a
trim, 1,147 MiB with one every 3 s, for 6 % more time (76.1 against 80.7 s); every second gave
0.94 GB for 8 % in an earlier A/B. The pages given back are faulted in again when reused, so a trim
costs in proportion to how often it runs. A fixed mmap threshold
(``MALLOC_MMAP_THRESHOLD_=262144``) bounds RSS too, for +40 % in page faults.

The server trims after a run at most every SERVE_TRIM_EVERY_S seconds: under steady load at 32
clients its RSS crept from 709 to 849 MiB over 4 minutes, still rising (Python's own allocations
flat under tracemalloc); trimmed every 10 s it moved within 560-790 MiB with no trend, at no
measurable cost in tokens/s. Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
import time

TRIM_EVERY_S = 3.0  # a trim costs the page faults that follow it: not per batch (see above)
SERVE_TRIM_EVERY_S = 10.0  # the server's runs are short and many: rarer trims bound it as well
_last_trim = 0.0


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim  # absent from musl: AttributeError
    except (OSError, AttributeError):
        return None


def release_free_memory(*, every: float = TRIM_EVERY_S) -> None:
    """Return the heap's free pages to the system (glibc), at most once per ``every`` seconds
    across threads; a no-op where there is no malloc_trim."""
    global _last_trim
    now = time.monotonic()
    if now - _last_trim < every:
        return
    _last_trim = now
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
