"""Dynamic batching: requests from many clients share the model's forward passes.

Request handlers tokenise their inputs and submit a :class:`Job`. Each of the runner's ``streams``
has a thread here that gathers runs: it takes the oldest job, waits at most ``max_wait`` seconds
(from that job's arrival) for more jobs of the same model until ``max_batch_tokens`` tokens are
gathered, and hands them to its stream as one run. The runner runs it, in this process
(:class:`LocalRunner`) or in the model process (model_process.py), where the engine sorts the
inputs by length and batches them under its token budget, and each input's rows go through its
job's :class:`Finish` (the layers it asked for, its OutputPlan) where they were computed: what comes
back is each request's own results, nothing more. With several streams, runs overlap: one is
computed while another's responses go out and its clients' next requests come in; and a stream's
thread hands it the next run before it answers the one that just ended, so the stream does not
sit idle while this process delivers (GIL-bound work). The queue is bounded in tokens: a job that
does not fit is refused with an estimate of when to retry (HTTP 429 + Retry-After). A merged run
that fails is run again in halves, so that only the request whose input fails gets the error.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .heap import HeapTrimmer

if TYPE_CHECKING:
    from ..encoder import Encoder
    from ..inputs import EncodedInput
    from ..plan import OutputPlan, Result
    from ..results import LayerStack

logger = logging.getLogger("layerwise")

Done = Callable[["dict[int, Result] | None", "BaseException | None"], None]
Results = list[tuple[int, "Result"]]  # (input index in the run, its result)


class QueueFullError(Exception):
    """The batcher's queue holds too many tokens; retry after ``retry_after`` seconds."""

    def __init__(self, queued_tokens: int, retry_after: int) -> None:
        super().__init__(
            f"the server's queue is full ({queued_tokens:,} tokens waiting); retry in {retry_after} s"
        )
        self.retry_after = retry_after


@dataclass(frozen=True)
class Finish:
    """What a job makes of each of its inputs' hidden states: the rows of ``layers`` (a run computes
    the union of its jobs' layers), then ``plan`` applied (None: the LayerStack itself)."""

    layers: tuple[int, ...]
    plan: OutputPlan | None = None
    n_hidden_states: int = 0

    def apply(self, stack: LayerStack) -> Result:
        if stack.layers != self.layers:
            pick = [stack.layers.index(k) for k in self.layers]
            stack = dataclasses.replace(stack, hidden=stack.hidden[pick], layers=self.layers)
        return stack if self.plan is None else self.plan.result(stack, self.n_hidden_states)


@dataclass(eq=False)
class Job:
    """One request's inputs for one model, and what it wants from them."""

    model: str
    encoded: Sequence[EncodedInput]
    finish: Finish
    on_done: Done
    stride: int | None = None
    n_tokens: int = 0
    submitted: float = field(default_factory=time.perf_counter)
    results: dict[int, Result] = field(default_factory=dict)
    finished: bool = False

    def __post_init__(self) -> None:
        self.n_tokens = sum(len(item) for item in self.encoded)

    def answer(self, results: dict[int, Result] | None, error: BaseException | None) -> None:
        """Tell the request, once. A request that cannot be told (its event loop closed under it)
        must not stop the stream thread that tells the others."""
        if self.finished:
            return
        self.finished = True
        try:
            self.on_done(results, error)
        except Exception:
            logger.warning("a request's answer could not be delivered", exc_info=True)

    def fail(self, error: BaseException) -> None:
        self.answer(None, error)


@dataclass(eq=False)
class Run:
    """Jobs merged into one run: inputs renumbered in order, each one's owner and Finish."""

    jobs: list[Job]
    model: str
    encoded: list[EncodedInput]
    finishes: list[Finish]
    owners: list[tuple[Job, int]]
    layers: tuple[int, ...]
    stride: int | None
    n_tokens: int
    started: float = field(default_factory=time.perf_counter)  # handed to its stream right after

    @classmethod
    def of(cls, jobs: list[Job]) -> Run:
        encoded: list[EncodedInput] = []
        finishes: list[Finish] = []
        owners: list[tuple[Job, int]] = []
        for job in jobs:
            for item in job.encoded:
                owners.append((job, item.index))
                finishes.append(job.finish)
                encoded.append(dataclasses.replace(item, index=len(encoded)))
        layers = tuple(sorted(set().union(*(job.finish.layers for job in jobs))))
        n_tokens = sum(job.n_tokens for job in jobs)
        return cls(jobs, jobs[0].model, encoded, finishes, owners, layers, jobs[0].stride, n_tokens)


class Runner(Protocol):
    """Where runs happen: this process (:class:`LocalRunner`) or the model process
    (model_process.ProcessRunner). ``streams`` runs at once, one per ``slot``: ``start`` hands a run
    to a free stream, ``collect`` waits for its results (each input's Finish applied)."""

    streams: int

    def start(self, slot: int, run: Run) -> None: ...

    def collect(self, slot: int) -> Results: ...

    @property
    def alive(self) -> bool: ...

    def wait_ready(self) -> None: ...

    def close(self, timeout: float | None = None) -> None: ...


def compute(
    encoder: Encoder,
    encoded: list[EncodedInput],
    layers: tuple[int, ...],
    stride: int | None,
    finishes: Sequence[Finish],
) -> Results:
    """A run's results: the engine's stacks (length-sorted batches under its token budget), each
    through its input's Finish."""
    stream = encoder.engine.stream(
        encoded, layers=layers, method="hidden_states", taps=(), stride=stride,
        batch_size=None, max_tokens=None, progress=False,
    )  # fmt: skip
    return [(index, finishes[index].apply(stack)) for index, stack in stream]


class LocalRunner:
    """Runs on this process's threads: with several streams, each on its share of torch's threads
    (streams.ForwardPool); with one, on the batcher's stream thread itself, in ``collect``."""

    alive = True

    def __init__(self, encoders: Mapping[str, Encoder], streams: int = 1) -> None:
        self.encoders, self.streams = dict(encoders), streams
        self._pending: dict[int, Run | Future] = {}
        self._pool: Any = None
        if streams > 1:
            from ..streams import ForwardPool

            self._pool = ForwardPool(streams)

    def start(self, slot: int, run: Run) -> None:
        self._pending[slot] = run if self._pool is None else self._pool.submit(self._compute, run)

    def collect(self, slot: int) -> Results:
        pending = self._pending.pop(slot)
        return pending.result() if isinstance(pending, Future) else self._compute(pending)

    def _compute(self, run: Run) -> Results:
        return compute(self.encoders[run.model], run.encoded, run.layers, run.stride, run.finishes)

    def wait_ready(self) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass


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
        self._running = 0  # streams with a run under way
        self._tokens_per_second = 5000.0  # updated after every run; used for Retry-After
        self._trimmer = HeapTrimmer()
        self._trim_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._serve_stream, args=(s,), name=f"layerwise-run-{s}", daemon=True)
            for s in range(self.streams)
        ]

    def start(self) -> None:
        """Wait until the runner is ready (the model process has loaded its models), then serve."""
        self.runner.wait_ready()
        for thread in self._threads:
            thread.start()

    def close(self, timeout: float | None = None) -> None:
        """Finish every queued job and the runs under way, then stop the stream threads and the runner."""
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
            self._jobs.append(job)
            self._queued_tokens += job.n_tokens
            self._observe_queue()
            self._cond.notify_all()

    # ------------------------------------------------------------------ stream threads
    def _serve_stream(self, slot: int) -> None:
        """One stream's runs, one after another, until the batcher is closed and drained. As soon as
        a run's results are in, the next run (if one is ready) goes to the stream; then the results
        go to their requests."""
        current = self._launch(slot, block=True)
        while current is not None:
            try:
                results, error = self.runner.collect(slot), None
            except BaseException as exc:  # every request of the run learns of it; the stream goes on
                results, error = None, exc
            if isinstance(error, Exception) and len(current.jobs) > 1 and self.runner.alive:
                # one request's input can fail a merged run: its batch-mates must not fail with it
                self._run_apart(slot, current.jobs)
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

    def _run_apart(self, slot: int, jobs: list[Job]) -> None:
        """Re-run the jobs of a failed run in halves on stream ``slot``, halving again whatever
        fails, until the job (or jobs) that fail on their own are found: each of those gets its own
        error, every other job its results. A poisoned input costs log2(jobs) extra runs, not a
        failure of every request merged with it."""
        middle = len(jobs) // 2
        for part in (jobs[:middle], jobs[middle:]):
            run = Run.of(part)
            try:
                self.runner.start(slot, run)
                results, error = self.runner.collect(slot), None
            except Exception as exc:
                results, error = None, exc
            if error is not None and len(part) > 1 and self.runner.alive:
                self._run_apart(slot, part)
            else:
                self._deliver(run, results, error)

    def _launch(self, slot: int, *, block: bool) -> Run | None:
        """Gather a run and hand it to stream ``slot``; None when none is ready (``block``: when the
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
        """Jobs for stream ``slot``'s next run: the oldest job's model, until the token budget is
        reached or the oldest job has waited ``max_wait``. None if no run is ready and ``block`` is
        false, or once the batcher is closed and its queue empty. A lone client's job, with every
        stream idle, is left to stream 0 (see _for_stream_zero)."""
        with self._cond:
            while True:
                if self._jobs and self._for_stream_zero(slot):
                    if not block:
                        return None
                    self._cond.wait(0.05)  # stream 0 takes it; look again then, or when woken
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

    def _for_stream_zero(self, slot: int) -> bool:
        """A lone client's job while no stream runs: stream 0's, not ``slot``'s (lock held).

        Stream 0 alone may run a lone job on all of the model process's threads (model_process.py:
        ProcessRunner.start); on any other stream it would run on that stream's one thread, and a
        second stream with a thread team of its own slows both (libgomp's idle threads then sleep
        instead of spinning, and every parallel region waits for a wake-up). One client at a time
        on a 2-core Xeon: 1.73x the tokens/s, p50 latency 20 -> 10 ms (benchmarks/serve_ab.py)."""
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
        model = self._jobs[0].model
        if sum(j.n_tokens for j in self._jobs if j.model == model) >= self.max_batch_tokens:
            return 0.0
        return self._jobs[0].submitted + self.max_wait - time.perf_counter()

    def _gather(self) -> list[Job]:
        """Take the oldest job's model's jobs under the token budget off the queue (lock held)."""
        model = self._jobs[0].model
        group: list[Job] = []
        tokens = 0
        for job in self._jobs:
            if job.model != model or (group and tokens + job.n_tokens > self.max_batch_tokens):
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
        if seconds > 0:  # every stream at this pace
            rate = self.streams * run.n_tokens / seconds
            self._tokens_per_second = 0.8 * self._tokens_per_second + 0.2 * rate
        if self.metrics is not None:
            self.metrics.observe_run(run.model, len(run.jobs), len(run.encoded), run.n_tokens, seconds)
        with self._trim_lock:
            self._trimmer.after_run(run.started)

    def _observe_queue(self) -> None:
        if self.metrics is not None:
            self.metrics.observe_queue(len(self._jobs), self._queued_tokens)
