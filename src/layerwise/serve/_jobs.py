"""What the batcher moves: a request's :class:`Job` (its inputs and what it wants of them), the
:class:`Run` jobs are merged into, and the queue's refusal (:class:`QueueFullError`)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._features.plan import OutputPlan, Result
    from .._inputs.encoding import EncodedInput
    from .._results import LayerStack

logger = logging.getLogger("layerwise")

Done = Callable[["dict[int, Result] | None", "BaseException | None"], None]
Results = list[tuple[int, "Result"]]  # (input index in the run, its result)


class QueueFullError(Exception):
    """The batcher's queue holds too many tokens (or result bytes); retry after ``retry_after`` s."""

    def __init__(self, queued_tokens: int, retry_after: int, what: str | None = None) -> None:
        held = what or f"{queued_tokens:,} tokens waiting"
        super().__init__(f"the server's queue is full ({held}); retry in {retry_after} s")
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


@dataclass(frozen=True)
class Forward:
    """What a run's forward computes, one value for all of its requests and sent whole to the model
    process: the model, the hidden states (the union of the requests'), the window stride of long
    inputs (None: a half window; only inputs the requests kept long are windowed) and a decoder's
    final norm (settled from each request's plan: requests that differ in it run apart)."""

    model: str
    layers: tuple[int, ...] = ()
    stride: int | None = None
    final_norm: bool | str | None = True


@dataclass(eq=False)
class Job:
    """One request's inputs for one model, and what it wants from them."""

    model: str
    encoded: Sequence[EncodedInput]
    finish: Finish
    on_done: Done
    stride: int | None = None  # the request's plan's (long_texts="window")
    final_norm: bool | str | None = True  # a decoder's final norm (OutputPlan.final_norm, settled)
    n_bytes: int = 0  # the vectors its results will hold (admission: Batcher.max_queue_bytes)
    n_tokens: int = 0
    submitted: float = field(default_factory=time.perf_counter)
    results: dict[int, Result] = field(default_factory=dict)
    finished: bool = False

    def __post_init__(self) -> None:
        self.n_tokens = sum(len(item) for item in self.encoded)

    @property
    def key(self) -> tuple[str, str, int | None]:
        """Jobs with the same key share a run: one model, one final norm and one window stride (what
        its forward computes: :class:`Forward`)."""
        return self.model, repr(self.final_norm), self.stride

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
    forward: Forward
    encoded: list[EncodedInput]
    finishes: list[Finish]
    owners: list[tuple[Job, int]]
    n_tokens: int
    started: float = field(default_factory=time.perf_counter)  # handed to its stream right after

    @property
    def model(self) -> str:
        return self.forward.model

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
        first = jobs[0]  # the jobs share a key: the same model, stride and final norm
        forward = Forward(first.model, layers, first.stride, first.final_norm)
        return cls(jobs, forward, encoded, finishes, owners, n_tokens)


class ResultBytes:
    """The bytes the results of the jobs queued or running will hold, bounded: a job that would
    pass ``max_bytes`` is refused (429) unless it would be the only one (a lone request always runs).
    A job gives its bytes back when it is answered."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.held = max_bytes, 0
        self._lock = threading.Lock()

    def take(self, job: Job) -> None:
        with self._lock:
            if self.held and self.held + job.n_bytes > self.max_bytes:
                held = f"{self.held / 2**20:,.0f} MiB of results queued or being computed"
                raise QueueFullError(0, 1, held)
            self.held += job.n_bytes
        on_done = job.on_done

        def done(results, error) -> None:
            with self._lock:
                self.held -= job.n_bytes
            on_done(results, error)

        job.on_done = done
