"""Concurrent forwards on the CPU (how many: the ``concurrent_forwards`` setting), and the lock that lets them
share one model. Not layer streaming (_model/streaming/), nor a CUDA stream.

On a CPU, one forward pass spread over every core by torch's intra-op threads is not the fastest
use of them: the matrices of a 2,048-token batch are small enough that the threads spend a good
part of each op waiting for one another. Two batches at once, each on half of the threads, keep
every core busy (benchmarks/packed_speed.py, 2 cores: +6 % on all-MiniLM-L6-v2; bigger models keep
two threads busy on their own, see FORWARDS_UP_TO_HIDDEN). :class:`ForwardPool` runs batches on
``concurrent_forwards`` threads, each with ``torch threads // concurrent_forwards`` intra-op
threads of its own (PyTorch keeps the OpenMP and MKL thread count per thread); the caller's own
setting is left as it was.

Only the packed forward runs concurrently: it reads the model's modules and patches nothing. The
Hugging Face forward may patch the model for its call (a truncated layer list, forward hooks, the
eager attention for attention maps), so it runs alone: :class:`ForwardLock`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch

from ...errors import OptionError

# Up to this hidden size, two forwards of one thread each beat one forward on two threads
# (all-MiniLM-L6-v2, 384: 6,782 vs 6,419 tok/s, +6 %); at BERT-base's 768 they lose (777 vs 918,
# -15 %): its matmuls already keep two threads busy, and two forwards at once read two layers'
# weights, twice the cache (benchmarks/packed_speed.py on 2 cores, results/packed_speed.json).
FORWARDS_UP_TO_HIDDEN = 512


def default_forwards(device: torch.device, hidden_size: int) -> int:
    """Two forwards at once on a CPU with two or more torch threads for a small model; else one (a GPU runs
    one queue of kernels)."""
    if device.type != "cpu" or hidden_size > FORWARDS_UP_TO_HIDDEN:
        return 1
    return 2 if torch.get_num_threads() >= 2 else 1


def check_forwards(forwards: int | None, device: torch.device, hidden_size: int) -> int:
    """The ``concurrent_forwards`` setting checked, or its default for ``device`` and the model."""
    if forwards is None:
        return default_forwards(device, hidden_size)
    if isinstance(forwards, bool) or not isinstance(forwards, int) or forwards < 1:
        raise OptionError(
            f"concurrent_forwards={forwards!r} must be a whole number >= 1 (or None for the default)"
        )
    if forwards > 1 and device.type != "cpu":
        raise OptionError(
            f"concurrent_forwards={forwards} runs batches side by side on the CPU only; on {device} use 1"
        )
    return forwards


class ForwardLock:
    """Shared by packed forwards, exclusive for Hugging Face forwards (reentrant for its owner).

    A thread waiting for the exclusive side blocks new shared holders, so a stream of packed
    batches cannot starve a Hugging Face call."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._owner: int | None = None
        self._depth = 0
        self._waiting = 0  # threads waiting for the exclusive side

    @contextmanager
    def shared(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._owner != me:
                while self._owner is not None or self._waiting:
                    self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
            else:
                self._waiting += 1
                try:
                    while self._owner is not None or self._shared:
                        self._cond.wait()
                finally:
                    self._waiting -= 1
                self._owner, self._depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if self._depth == 0:
                    self._owner = None
                    self._cond.notify_all()


class ForwardPool:
    """``forwards`` worker threads for forward passes, started on first use (again after a fork:
    threads do not survive one), each with its share of torch's intra-op threads."""

    def __init__(self, forwards: int) -> None:
        self.forwards = forwards
        self._executor: ThreadPoolExecutor | None = None
        self._pid = 0
        self._start_lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._started().submit(fn, *args)

    def _started(self) -> ThreadPoolExecutor:
        with self._start_lock:
            if self._executor is None or self._pid != os.getpid():
                threads = torch.get_num_threads()
                per_stream = max(1, threads // self.forwards)
                ready = threading.Barrier(self.forwards + 1)
                executor = ThreadPoolExecutor(
                    self.forwards,
                    thread_name_prefix="layerwise-forward",
                    initializer=_init_stream,
                    initargs=(per_stream, ready),
                )
                # every worker starts now and holds in the barrier, so each submit below starts one
                for _ in range(self.forwards):
                    executor.submit(int)
                ready.wait(timeout=60)
                # set_num_threads also set the default for threads started later: put it back (the
                # workers keep theirs, this thread keeps its own)
                torch.set_num_threads(threads)
                self._executor, self._pid = executor, os.getpid()
            return self._executor


def _init_stream(threads: int, ready: threading.Barrier) -> None:
    # A thread takes torch's default thread count on its first parallel op (lazily, once): have
    # that happen now (get_num_threads does it), or it would undo the setting below later.
    torch.get_num_threads()
    torch.set_num_threads(threads)
    ready.wait(timeout=60)
