"""A text's rows in the store's dtype and order, cast as fast as this process can.

The writer turns each text's hidden states ``(layers, tokens, hidden)`` float32 into token-major
rows ``(tokens, layers, hidden)`` of the store's dtype. NumPy's float32 -> float16 cast of a
transposed view runs element by element: 9.8 ms for a 2,048-token batch of all-MiniLM-L6-v2's 7
layers, on the thread that feeds the writer while the concurrent forwards need both cores. torch's copy
into a float16 array does the same cast with vector instructions in 0.6 ms (16x), bit for bit the
same numbers (round to nearest even, overflow to inf; tests/test_store.py). On one thread: for the
2,050 texts of benchmarks/store_speed.py, 0.11 s in all, against 0.54 s for NumPy's cast and
1.41 s for torch's on two threads, whose second thread waits for a core the forwards hold
(benchmarks/load_and_cast.py).
torch is always loaded when a store is written (the Encoder needs it); this module never imports
it, so reading a store stays torch-free.
"""

from __future__ import annotations

import sys

import numpy as np


def stored_rows(rows: np.ndarray, dtype: str | np.dtype) -> np.ndarray:
    """``rows`` as a new C-contiguous array of ``dtype`` (or ``rows`` itself when it already is)."""
    dtype = np.dtype(dtype)
    if rows.dtype == dtype and rows.flags.c_contiguous:
        return rows
    torch = sys.modules.get("torch")
    if torch is None or not rows.flags.writeable or rows.dtype != np.float32 or min(rows.strides) < 0:
        return np.ascontiguousarray(rows, dtype=dtype)  # torch.from_numpy takes none of these
    out = np.empty(rows.shape, dtype=dtype)
    threads = torch.get_num_threads()
    if threads > 1:  # one text's rows are small, and the concurrent forwards hold the cores meanwhile:
        torch.set_num_threads(1)  # a 2-thread copy waits for a core (1.41 s vs 0.11 s per corpus)
    try:
        torch.from_numpy(out).copy_(torch.from_numpy(rows))
    finally:
        if threads > 1:
            torch.set_num_threads(threads)  # this thread's own setting (torch keeps one per thread)
    return out
