"""Dynamic batching: requests from many clients share the model's forward passes.

Request handlers tokenise their inputs and submit a :class:`Job`. Each of the runner's ``forwards``
has a thread here that gathers runs: it takes the oldest job, waits at most ``max_wait`` seconds
(from that job's arrival) for more jobs of the same model until ``max_batch_tokens`` tokens are
gathered, and hands them to its slot as one run. The runner runs it, in this process
(:class:`LocalRunner`) or in the model process (_model_process.py), where the engine sorts the
inputs by length and batches them under its token budget, and each input's rows go through its
job's :class:`Finish` (the layers it asked for, its OutputPlan) where they were computed: what comes
back is each request's own results, nothing more. With several concurrent forwards, runs overlap:
one is computed while another's responses go out and its clients' next requests come in; and a
slot's thread hands it the next run before it answers the one that just ended, so the slot does not
sit idle while this process delivers (GIL-bound work). The queue is bounded in tokens: a job that
does not fit is refused with an estimate of when to retry (HTTP 429 + Retry-After). A merged run
that fails is run again in halves, so that only the request whose input fails gets the error.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .._host.memory import SERVE_TRIM_EVERY_S, release_free_memory
from ._jobs import Done, Finish, Job, QueueFullError, ResultBytes, Results, Run
from ._runners import LocalRunner, Runner, compute, run_apart

if TYPE_CHECKING:
    from .._encoder import Encoder

__all__ = [
    "Batcher",
    "Done",
    "Finish",
    "Job",
    "LocalRunner",
    "QueueFullError",
    "Results",
    "Run",
    "Runner",
    "compute",
]

logger = logging.getLogger("layerwise")


class Batcher:
    """Merges jobs into model runs; see the module docstring."""

    def __init__(
        self,
        encoders: Mapping[str, Encoder],
        *,
        max_batch_tokens: int = 8192,
        max_wait: float = 0.010,
        max_queue_tokens: int = 262_144,
        max_queue_bytes: int = 512 * 2**20,
        runner: Runner | None = None,
        metrics: Any = None,
    ) -> None:
        self.runner: Runner = runner if runner is not None else LocalRunner(encoders)
        self.forwards = self.runner.forwards
        self.max_batch_tokens, self.max_wait, self.max_queue_tokens = (
            max_batch_tokens,
            max_wait,
            max_queue_tokens,
        )
        self.metrics = metrics
        self.result_bytes = ResultBytes(max_queue_bytes)
        self._jobs: deque[Job] = deque()
        self._queued_tokens = 0
        self._side_tokens = 0  # tokens of side_work waiting or running
        self._side_lock = threading.Lock()
        self._cond = threading.Condition()
        self._closed = False
        self._last_group = 0  # jobs in the previous run
        self._running = 0  # forwards with a run under way
        self._tokens_per_second = 5000.0  # updated after every run; used for Retry-After
        self._trim_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._serve_slot, args=(s,), name=f"layerwise-run-{s}", daemon=True)
            for s in range(self.forwards)
        ]

    def start(self) -> None:
        """Wait until the runner is ready (the model process has loaded its models), then serve."""
        self.runner.wait_ready()
        for thread in self._threads:
            thread.start()

    def close(self, timeout: float | None = None) -> None:
        """Finish every queued job and the runs under way, then stop the slot threads and the runner."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        deadline = None if timeout is None else time.perf_counter() + timeout
        for thread in self._threads:
            if thread.is_alive():
                thread.join(None if deadline is None else max(0.0, deadline - time.perf_counter()))
        self.runner.close(timeout)

    @property
    def alive(self) -> bool:
        return all(thread.is_alive() for thread in self._threads) and self.runner.alive

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
            self.result_bytes.take(job)
            self._jobs.append(job)
            self._queued_tokens += job.n_tokens
            self._observe_queue()
            self._cond.notify_all()

    @contextlib.contextmanager
    def side_work(self, n_tokens: int) -> Iterator[None]:
        """Admission for model work outside the runs (the explorer's attention maps and logit lens,
        which need other forwards): its tokens count in the queue (429 when it is full) while it
        waits and runs, and such work runs one piece at a time."""
        with self._cond:
            if (self._jobs or self._side_tokens) and self._queued_tokens + n_tokens > self.max_queue_tokens:
                raise QueueFullError(self._queued_tokens, 1)
            self._queued_tokens += n_tokens
            self._side_tokens += n_tokens
            self._observe_queue()
        try:
            with self._side_lock:
                yield
        finally:
            with self._cond:
                self._queued_tokens -= n_tokens
                self._side_tokens -= n_tokens
                self._observe_queue()

    # ------------------------------------------------------------------ slot threads
    def _serve_slot(self, slot: int) -> None:
        """One slot's runs, one after another, until the batcher is closed and drained. As soon as
        a run's results are in, the next run (if one is ready) goes to the slot; then the results
        go to their requests."""
        current = self._launch(slot, block=True)
        while current is not None:
            try:
                results, error = self.runner.collect(slot), None
            except BaseException as exc:  # every request of the run learns of it; the slot goes on
                results, error = None, exc
            if isinstance(error, Exception) and len(current.jobs) > 1 and self.runner.alive:
                # one request's input can fail a merged run: its batch-mates must not fail with it
                run_apart(self.runner, slot, current.jobs, self._deliver)
                with self._cond:
                    self._running -= 1
                current = self._launch(slot, block=True)
                continue
            with self._cond:
                self._running -= 1
            following = self._launch(slot, block=False)
            self._deliver(current, results, error)
            if error is not None and not isinstance(error, Exception):
                raise error
            current = following or self._launch(slot, block=True)

    def _launch(self, slot: int, *, block: bool) -> Run | None:
        """Gather a run and hand it to slot ``slot``; None when none is ready (``block``: when the
        batcher is closed and drained)."""
        while True:
            jobs = self._take(slot, block=block)
            if jobs is None:
                return None
            try:
                run = Run.of(jobs)
                self.runner.start(slot, run)
            except BaseException as exc:  # no request may wait for ever: each learns of it
                with self._cond:
                    self._running -= 1
                for job in jobs:
                    job.fail(exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                if self.metrics is not None:
                    self.metrics.observe_waits(run.started - job.submitted for job in jobs)
                return run

    def _take(self, slot: int, *, block: bool) -> list[Job] | None:
        """Jobs for slot ``slot``'s next run: the oldest job's model, until the token budget is
        reached or the oldest job has waited ``max_wait``. None if no run is ready and ``block`` is
        false, or once the batcher is closed and its queue empty. A lone client's job, with every
        slot idle, is left to slot 0 (see _for_slot_zero)."""
        with self._cond:
            while True:
                if self._jobs and self._for_slot_zero(slot):
                    if not block:
                        return None
                    self._cond.wait(0.05)  # slot 0 takes it; look again then, or when woken
                elif self._jobs:
                    wait = self._wait_left()
                    if wait <= 0:
                        self._running += 1
                        return self._gather()
                    if not block:
                        return None
                    self._cond.wait(wait)
                elif self._closed or not block:
                    return None
                else:
                    self._cond.wait()

    def _for_slot_zero(self, slot: int) -> bool:
        """A lone client's job while no slot runs: slot 0's, not ``slot``'s (lock held).

        Stream 0 alone may run a lone job on all of the model process's threads (_model_process.py:
        ProcessRunner.start); on any other slot it would run on that slot's one thread, and a
        second slot with a thread team of its own slows both (libgomp's idle threads then sleep
        instead of spinning, and every parallel region waits for a wake-up). One client at a time
        on a 2-core Xeon: 1.73x the tokens/s, p50 latency 20 -> 10 ms (docs/serving-performance.md)."""
        return (
            slot != 0
            and self._running == 0
            and len(self._jobs) == 1
            and self._last_group <= 1
            and not self._closed
        )

    def _wait_left(self) -> float:
        """Seconds the queue's oldest job still waits for company (called with the lock held)."""
        if self._closed:
            return 0.0  # draining
        if self._last_group <= 1 and len(self._jobs) == 1:
            return 0.0  # a lone client: waiting for company only adds latency
        key = self._jobs[0].key
        if sum(j.n_tokens for j in self._jobs if j.key == key) >= self.max_batch_tokens:
            return 0.0
        return self._jobs[0].submitted + self.max_wait - time.perf_counter()

    def _gather(self) -> list[Job]:
        """Take the oldest job's model's jobs (with its final norm) under the token budget off the
        queue (lock held)."""
        key = self._jobs[0].key
        group: list[Job] = []
        tokens = 0
        for job in self._jobs:
            if job.key != key or (group and tokens + job.n_tokens > self.max_batch_tokens):
                continue
            group.append(job)
            tokens += job.n_tokens
        if len(group) == len(self._jobs):
            self._jobs.clear()
        else:
            taken = set(map(id, group))
            self._jobs = deque(job for job in self._jobs if id(job) not in taken)
        self._last_group = len(group)
        self._queued_tokens -= tokens
        self._observe_queue()
        return group

    def _deliver(self, run: Run, results: Results | None, error: BaseException | None) -> None:
        """Each job's results to its request, or the run's error to each job not yet answered."""
        seconds = time.perf_counter() - run.started
        if results is not None:
            try:
                for index, result in results:
                    job, local = run.owners[index]
                    job.results[local] = result
                    if len(job.results) == len(job.encoded):
                        job.answer(job.results, None)
            except Exception as exc:
                error = exc
        for job in run.jobs:  # a run that ended without some input's results (or failed)
            job.fail(error or RuntimeError("the model run returned no result for some inputs"))
        if seconds > 0:  # every slot at this pace
            rate = self.forwards * run.n_tokens / seconds
            self._tokens_per_second = 0.8 * self._tokens_per_second + 0.2 * rate
        if self.metrics is not None:
            self.metrics.observe_run(run.model, len(run.jobs), len(run.encoded), run.n_tokens, seconds)
        with self._trim_lock:
            release_free_memory(every=SERVE_TRIM_EVERY_S)

    def _observe_queue(self) -> None:
        if self.metrics is not None:
            self.metrics.observe_queue(len(self._jobs), self._queued_tokens)
