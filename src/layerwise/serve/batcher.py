"""Dynamic batching: requests from many clients share the model's forward passes.

Request handlers tokenise their inputs and submit a :class:`Job`. A worker thread gathers runs:
it waits for a free stream, takes the oldest job, waits at most ``max_wait`` seconds (from that
job's arrival) for more jobs of the same model until ``max_batch_tokens`` tokens are gathered, and
hands them to the stream as one run. The runner runs it, in this process (:class:`LocalRunner`) or
in the model process (model_process.py), where the engine sorts the inputs by length and batches
them under its token budget. With several streams, runs overlap: one is computed while another's
responses go out and its clients' next requests come in. Each job gets exactly its own rows back
(only the hidden states it asked for), through its ``on_done`` callback. The queue is bounded in
tokens: a job that does not fit is refused with an estimate of when to retry (HTTP 429 +
Retry-After).
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..encoder import Encoder
    from ..inputs import EncodedInput
    from ..results import LayerStack

TRIM_EVERY = 10.0  # seconds between returns of freed heap memory to the system (see _release_free_heap)

Done = Callable[["dict[int, LayerStack] | None", "BaseException | None"], None]


class QueueFullError(Exception):
    """The batcher's queue holds too many tokens; retry after ``retry_after`` seconds."""

    def __init__(self, queued_tokens: int, retry_after: int) -> None:
        super().__init__(
            f"the server's queue is full ({queued_tokens:,} tokens waiting); retry in {retry_after} s"
        )
        self.retry_after = retry_after


@dataclass(eq=False)
class Job:
    """One request's inputs for one model; ``layers`` are the hidden states it needs."""

    model: str
    encoded: Sequence[EncodedInput]
    layers: tuple[int, ...]
    on_done: Done
    stride: int | None = None
    n_tokens: int = 0
    submitted: float = field(default_factory=time.perf_counter)
    results: dict[int, LayerStack] = field(default_factory=dict)
    finished: bool = False

    def __post_init__(self) -> None:
        self.n_tokens = sum(len(item) for item in self.encoded)


class Runner(Protocol):
    """Where runs happen: this process (:class:`LocalRunner`) or the model process
    (model_process.ProcessRunner). ``streams`` runs at once, each on its own ``slot``."""

    streams: int

    def run(
        self,
        slot: int,
        model: str,
        encoded: Sequence[EncodedInput],
        layers: tuple[int, ...],
        stride: int | None,
    ) -> Iterator[tuple[int, LayerStack]]: ...

    @property
    def alive(self) -> bool: ...

    def wait_ready(self) -> None: ...

    def executor(self) -> Executor | None: ...

    def close(self, timeout: float | None = None) -> None: ...


class LocalRunner:
    """Runs on this process's threads: with several streams, each on its share of torch's threads
    (streams.ForwardPool); with one, on the batcher's worker thread itself."""

    alive = True

    def __init__(self, encoders: Mapping[str, Encoder], streams: int = 1) -> None:
        self.encoders, self.streams = dict(encoders), streams

    def run(
        self,
        slot: int,
        model: str,
        encoded: Sequence[EncodedInput],
        layers: tuple[int, ...],
        stride: int | None,
    ) -> Iterator[tuple[int, LayerStack]]:
        return self.encoders[model].engine.stream(
            list(encoded), layers=layers, method="hidden_states", taps=(), stride=stride,
            batch_size=None, max_tokens=None, progress=False,
        )  # fmt: skip

    def wait_ready(self) -> None:
        pass

    def executor(self) -> Executor | None:
        from ..streams import ForwardPool

        return _PoolExecutor(ForwardPool(self.streams)) if self.streams > 1 else None

    def close(self, timeout: float | None = None) -> None:
        pass


class _PoolExecutor(Executor):
    """A ForwardPool (threads with their share of torch's threads) as an Executor."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def submit(self, fn, /, *args, **kwargs):
        return self.pool.submit(fn, *args)


class Batcher:
    """Merges jobs into model runs; see the module docstring."""

    def __init__(
        self,
        encoders: Mapping[str, Encoder],
        *,
        max_batch_tokens: int = 8192,
        max_wait: float = 0.010,
        max_queue_tokens: int = 262_144,
        runner: Runner | None = None,
        metrics: Any = None,
    ) -> None:
        self.runner: Runner = runner if runner is not None else LocalRunner(encoders)
        self.streams = self.runner.streams
        self._free_slots: queue.SimpleQueue[int] = queue.SimpleQueue()  # streams without a run
        for slot in range(self.streams):
            self._free_slots.put(slot)
        self._executor: Executor | None = None
        self.max_batch_tokens, self.max_wait, self.max_queue_tokens = (
            max_batch_tokens,
            max_wait,
            max_queue_tokens,
        )
        self.metrics = metrics
        self._jobs: deque[Job] = deque()
        self._queued_tokens = 0
        self._cond = threading.Condition()
        self._closed = False
        self._last_group = 0  # jobs in the previous run
        self._tokens_per_second = 5000.0  # updated after every run; used for Retry-After
        self._trimmer = HeapTrimmer()
        self._thread = threading.Thread(target=self._loop, name="layerwise-model", daemon=True)

    def start(self) -> None:
        """Wait until the runner is ready (the model process has loaded its models), then serve."""
        self.runner.wait_ready()
        self._executor = self.runner.executor()
        self._thread.start()

    def close(self, timeout: float | None = None) -> None:
        """Finish every queued job and the runs under way, then stop the worker and the runner."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        for _ in range(self.streams):  # each stream's last run has finished
            try:
                self._free_slots.get(timeout=timeout)
            except queue.Empty:
                break
        self.runner.close(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.runner.alive

    @property
    def queued(self) -> tuple[int, int]:
        """(jobs, tokens) waiting."""
        with self._cond:
            return len(self._jobs), self._queued_tokens

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise QueueFullError(self._queued_tokens, 1)
            if self._jobs and self._queued_tokens + job.n_tokens > self.max_queue_tokens:
                wait = math.ceil((self._queued_tokens + job.n_tokens) / max(self._tokens_per_second, 1.0))
                raise QueueFullError(self._queued_tokens, max(1, wait))
            self._jobs.append(job)
            self._queued_tokens += job.n_tokens
            self._observe_queue()
            self._cond.notify_all()

    # ------------------------------------------------------------------ worker
    def _loop(self) -> None:
        while True:
            # a free stream first, then the jobs: a run takes every job that came while every
            # stream was busy
            slot = self._free_slots.get()
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    self._free_slots.put(slot)
                    return  # closed and drained
                group = self._gather()
            if self._executor is None:
                self._run_on(slot, group)
            else:
                self._executor.submit(self._run_on, slot, group)

    def _run_on(self, slot: int, group: list[Job]) -> None:
        try:
            self._run(slot, group)
        except BaseException as exc:  # no request may wait for ever: each learns of it
            for job in group:
                if not job.finished:
                    job.finished = True
                    job.on_done(None, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._free_slots.put(slot)

    def _gather(self) -> list[Job]:
        """Jobs for one run (called with the lock held): the oldest job's model, until the token
        budget is reached or the oldest job has waited ``max_wait`` (no wait for a lone job after a
        lone job: one client at a time has nobody to wait for)."""
        model = self._jobs[0].model
        deadline = self._jobs[0].submitted + self.max_wait
        if self._last_group <= 1 and len(self._jobs) == 1:
            deadline = 0.0  # a lone client: waiting for company only adds latency
        while not self._closed:
            tokens = sum(j.n_tokens for j in self._jobs if j.model == model)
            remaining = deadline - time.perf_counter()
            if tokens >= self.max_batch_tokens or remaining <= 0:
                break
            self._cond.wait(remaining)
        group: list[Job] = []
        tokens = 0
        for job in list(self._jobs):
            if job.model != model or (group and tokens + job.n_tokens > self.max_batch_tokens):
                continue
            group.append(job)
            tokens += job.n_tokens
        for job in group:
            self._jobs.remove(job)
        self._last_group = len(group)
        self._queued_tokens -= tokens
        self._observe_queue()
        return group

    def _run(self, slot: int, group: list[Job]) -> None:
        merged: list[EncodedInput] = []
        owners: list[tuple[Job, int]] = []
        for job in group:
            for item in job.encoded:
                owners.append((job, item.index))
                merged.append(dataclasses.replace(item, index=len(merged)))
        layers = tuple(sorted(set().union(*(job.layers for job in group))))
        started = time.perf_counter()
        try:
            for index, stack in self.runner.run(slot, group[0].model, merged, layers, group[0].stride):
                job, local = owners[index]
                if job.layers != layers:  # only the rows this request asked for
                    pick = [layers.index(k) for k in job.layers]
                    stack = dataclasses.replace(stack, hidden=stack.hidden[pick], layers=job.layers)
                job.results[local] = stack
                if len(job.results) == len(job.encoded):
                    job.finished = True
                    job.on_done(job.results, None)
        except BaseException as exc:  # every waiting request learns of it; the worker goes on
            for job in group:
                if not job.finished:
                    job.finished = True
                    job.on_done(None, exc)
            if not isinstance(exc, Exception):
                raise
        seconds = time.perf_counter() - started
        n_tokens = sum(job.n_tokens for job in group)
        if seconds > 0:  # every stream at this pace
            rate = self.streams * n_tokens / seconds
            self._tokens_per_second = 0.8 * self._tokens_per_second + 0.2 * rate
        if self.metrics is not None:
            self.metrics.observe_run(group[0].model, len(group), len(merged), n_tokens, seconds)
        self._trimmer.after_run(started)

    def _observe_queue(self) -> None:
        if self.metrics is not None:
            self.metrics.observe_queue(len(self._jobs), self._queued_tokens)


class HeapTrimmer:
    """Returns freed heap memory to the system after a run, at most every TRIM_EVERY seconds (the
    in-process batcher and each stream of the model process hold one)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()

    def after_run(self, started: float) -> None:
        if started - self._last > TRIM_EVERY:
            self._last = started
            _release_free_heap()


def _release_free_heap() -> None:
    """Give freed heap memory back to the system (glibc ``malloc_trim``; elsewhere nothing).

    Runs of ever-new batch shapes leave glibc's heaps fragmented: freed memory stays mapped, and a
    server's RSS crept up without end under steady load (709 -> 849 MiB over 4 minutes at 32
    clients, still rising; Python's own allocations were flat under tracemalloc, and
    ``malloc_trim`` gave all but about 20 MiB of the growth back). Trimmed every TRIM_EVERY seconds
    it moves within a band (560-790 MiB over the same 4 minutes, no trend) at no measurable cost in
    tokens/s: the call takes well under a millisecond."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _malloc_trim() -> Any:
    global _TRIM
    if _TRIM is False:
        import ctypes
        import ctypes.util

        _TRIM = None
        name = ctypes.util.find_library("c")
        if name:
            try:
                _TRIM = ctypes.CDLL(name).malloc_trim
            except (OSError, AttributeError):  # not glibc (musl, macOS)
                _TRIM = None
    return _TRIM


_TRIM: Any = False  # not looked up yet
