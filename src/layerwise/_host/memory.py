"""Giving freed memory back to the system during a long extraction (glibc's ``malloc_trim``).

A forward pass allocates and frees large, short-lived buffers (hidden states, attention scores:
0.1 to 30 MB each). glibc's dynamic mmap threshold rises to the size of each freed mmap'd block,
so after the first batches these buffers come from the heap, and freed heap memory that is not at
the top of the heap stays in the process. A ``malloc_trim(0)`` gives the free pages back; the file
and store writers call it at most every TRIM_EVERY_S seconds as results come, the server after a
run at most every SERVE_TRIM_EVERY_S seconds.

A trim costs the page faults that follow it: most of what it gives back is the forward's own
working set, faulted in again within seconds, so the more often it runs, the more it costs and the
lower the RSS it holds. Measured on 30,000 texts to sentence-level Parquet in one process,
alternating, two rounds, against no trim (``benchmarks/corpus_io.py --part trim``): every 3 s, +6.0 %
time for a median RSS 29 % lower; every 10 s, +3.2 % for 12 % lower; every 30 s, +1.8 % for 3 %.
Every 10 s bounds the slow creep of a long run (``--part full``: 200,000 texts) for a cost near
the noise: ``extract_to_store`` takes 1-3 % more time than in-memory ``extract``
(``benchmarks/store_cost.py``). A fixed mmap threshold
(``MALLOC_MMAP_THRESHOLD_=262144``) bounds RSS too, for +40 % in page faults.

The server's RSS under steady load at 32 clients crept from 709 to 849 MiB over 4 minutes, still
rising (Python's own allocations flat under tracemalloc); trimmed every 10 s it moved within 560-790
MiB with no trend, at no measurable cost in tokens/s. Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
import time

TRIM_EVERY_S = 10.0  # a trim costs the page faults that follow it: rare enough to cost ~1-3 % (above)
SERVE_TRIM_EVERY_S = 10.0  # the server's runs are short and many: the same bound holds its RSS flat
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


def available_memory() -> int:
    """Bytes of memory available to this process (MemAvailable), or 8 GiB when unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30
