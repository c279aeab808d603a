"""Where a run is computed: :class:`LocalRunner` (this process's threads) or the model process
(model_process.ProcessRunner), both behind the :class:`Runner` protocol the batcher drives."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from .._engine.call import Call
from ._jobs import Finish, Forward, Job, Results, Run

if TYPE_CHECKING:
    from .._encoder import Encoder
    from .._inputs.encoding import EncodedInput


class Runner(Protocol):
    """Where runs happen: this process (:class:`LocalRunner`) or the model process
    (model_process.ProcessRunner). ``forwards`` runs at once, one per ``slot``: ``start`` hands a run
    to a free stream, ``collect`` waits for its results (each input's Finish applied)."""

    forwards: int

    def start(self, slot: int, run: Run) -> None: ...

    def collect(self, slot: int) -> Results: ...

    @property
    def alive(self) -> bool: ...

    def wait_ready(self) -> None: ...

    def close(self, timeout: float | None = None) -> None: ...


def compute(
    encoder: Encoder, forward: Forward, encoded: list[EncodedInput], finishes: Sequence[Finish]
) -> Results:
    """A run's results: the engine's stacks (length-sorted batches under its token budget, as
    ``forward`` says), each through its input's Finish (its request's OutputPlan). The server's
    runs merge requests, so they take the engine's stream, not Encoder.iter_results."""
    call = Call(forward.layers, encoder.method, stride=forward.stride, final_norm=forward.final_norm)  # type: ignore[arg-type]
    stream = encoder.engine.run_inputs(encoded, call, progress=False)
    return [(index, finishes[index].apply(stack)) for index, stack in stream]


class LocalRunner:
    """Runs on this process's threads: with several forwards at once, each on its share of torch's threads
    (concurrent.ForwardPool); with one, on the batcher's run thread itself, in ``collect``."""

    alive = True

    def __init__(self, encoders: Mapping[str, Encoder], forwards: int = 1) -> None:
        self.encoders, self.forwards = dict(encoders), forwards
        self._pending: dict[int, Run | Future] = {}
        self._pool: Any = None
        if forwards > 1:
            from .._model.forward.concurrent import ForwardPool

            self._pool = ForwardPool(forwards)

    def start(self, slot: int, run: Run) -> None:
        self._pending[slot] = run if self._pool is None else self._pool.submit(self._compute, run)

    def collect(self, slot: int) -> Results:
        pending = self._pending.pop(slot)
        return pending.result() if isinstance(pending, Future) else self._compute(pending)

    def _compute(self, run: Run) -> Results:
        return compute(self.encoders[run.model], run.forward, run.encoded, run.finishes)

    def wait_ready(self) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass


def run_apart(
    runner: Runner,
    slot: int,
    jobs: list[Job],
    deliver: Callable[[Run, Results | None, BaseException | None], None],
) -> None:
    """Re-run the jobs of a failed run in halves on stream ``slot``, halving again whatever fails,
    until the job (or jobs) that fail on their own are found: each of those gets its own error,
    every other job its results (``deliver``). A poisoned input costs about 2 log2(jobs) extra
    runs, not a failure of every request merged with it."""
    middle = len(jobs) // 2
    for part in (jobs[:middle], jobs[middle:]):
        run = Run.of(part)
        try:
            runner.start(slot, run)
            results, error = runner.collect(slot), None
        except Exception as exc:
            results, error = None, exc
        if error is not None and len(part) > 1 and runner.alive:
            run_apart(runner, slot, part, deliver)
        else:
            deliver(run, results, error)
