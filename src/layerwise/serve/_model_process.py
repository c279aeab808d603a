"""The served models in a process of their own, so that the HTTP event loop never holds their GIL.

Why: every torch op gives the GIL up and must win it back before the next one. In one process the
event loop (parsing, validation, tokenising, pooling, JSON: pure Python) holds it for a good part
of each second, and each of the forward's few hundred ops per run waits for it. In-process, a Python
thread busy 20 % of the time cost two concurrent forwards 15-18 % of their tokens/s, and a thread doing
the same share of GIL-free work (sha256) cost nothing (ad-hoc, 2 cores). In a process of their own,
the models share the machine's cores with the event loop but not its GIL: the forward runs as it
does offline, on ``forwards`` concurrent forwards (concurrent.py, the same default as extraction).

The model process loads each model again from its source (names, folders and weights as the server
loaded them; a checkpoint's weights are checked to be the same, by hash, before serving). Each
stream is one pipe: the server sends a run's inputs (already tokenised and checked against the
limits) and each input's Finish (its request's layers and OutputPlan); the process answers with each
input's result (a sentence vector for an embedding: a few KB, not the hidden states of every token),
or with the error the run raised. If the process dies, every waiting run fails with that news and
``/health`` turns 503.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._host.memory import SERVE_TRIM_EVERY_S, release_free_memory
from .._settings.settings import Settings
from ..errors import LayerwiseError, ModelLoadError
from ._jobs import Results, Run
from ._runners import compute

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from .._encoder import Encoder

START_TIMEOUT = 600.0  # seconds for the process to load its models (a large hub model from a slow disk)


def spec_of(encoder: Encoder) -> Settings:
    """How the model process loads one served model: the server's Encoder's settings, whole, from
    the files it was loaded from, on one stream per pipe (its weights are compared by hash once
    loaded: ProcessRunner.wait_ready)."""
    return encoder.settings.replace(model=str(encoder.source), concurrent_forwards=1)


class ModelProcessError(LayerwiseError):
    """The model process is gone (killed, out of memory) or could not start."""


class ProcessRunner:
    """Runs the batcher's runs in the model process, one pipe per stream."""

    def __init__(self, encoders: Mapping[str, Encoder], forwards: int | None = None) -> None:
        context = multiprocessing.get_context("spawn")  # never fork a process that holds torch threads
        self.specs = {name: spec_of(encoder) for name, encoder in encoders.items()}
        if forwards is None:
            from .._model.forward.concurrent import default_forwards

            first = next(iter(encoders.values()))
            forwards = default_forwards(first.device, max(e.hidden_size for e in encoders.values()))
        self.forwards = forwards
        ends = [context.Pipe() for _ in range(forwards)]
        self._conns: list[Connection] = [mine for mine, _ in ends]
        ready_here, ready_there = context.Pipe(duplex=False)
        self.process = context.Process(
            target=_main,
            args=(self.specs, [theirs for _, theirs in ends], ready_there, _threads()),
            name="layerwise-models",
            daemon=True,
        )
        with _model_process_environment():
            self.process.start()
        for _, theirs in ends:  # the child holds these; closing ours lets a dead child show as EOF
            theirs.close()
        ready_there.close()
        self._ready = ready_here
        self._started = False
        self._count_lock = threading.Lock()
        self._in_flight = 0  # runs sent and not answered
        from .._model.loading.weights_hash import weights_sha256

        # hashed while the process loads, compared once it has
        self._hashes = {name: weights_sha256(enc.models.current) for name, enc in encoders.items()}

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until every model is loaded in the process and checked; raises what went wrong."""
        if self._started:
            return
        if not self._ready.poll(timeout):
            self.close(0)
            raise ModelProcessError(f"the model process did not load its models in {timeout:.0f} s")
        try:
            status, detail = self._ready.recv()
        except EOFError:
            self.process.join(5)
            raise ModelProcessError(
                f"the model process exited while loading its models (exit code {self.process.exitcode})"
            ) from None
        if status != "ok":
            self.close(5)
            raise detail
        for name, digest in self._hashes.items():
            if digest != detail[name]:
                self.close(5)
                raise ModelLoadError(
                    f"model {name!r}: the weights the model process loaded from "
                    f"{self.specs[name].model!r} differ from this process's (edited in Python after "
                    "loading, or changed on disk since): serve it in-process (model_process=False), "
                    "or save the edited model and serve that folder"
                )
        self._started = True

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def start(self, slot: int, run: Run) -> None:
        """Send ``run`` to stream ``slot`` (each slot is used by one batcher thread at a time)."""
        with self._count_lock:
            self._in_flight += 1
            # only stream 0 ever runs on all threads: one OpenMP thread team in the process (the
            # batcher leaves lone jobs to stream 0: Batcher._for_stream_zero)
            alone = self._in_flight == 1 and slot == 0
        try:
            self._conns[slot].send((run.forward, run.encoded, run.finishes, alone))
        except BaseException as exc:  # not sent: it will not be collected
            self._done()
            if isinstance(exc, (OSError, ValueError)):  # the pipe is closed: the process is gone
                raise self._gone() from None
            raise

    def collect(self, slot: int) -> Results:
        """The results of the run sent to ``slot``, each input's Finish applied in the process."""
        try:
            status, payload = self._conns[slot].recv()
        except (EOFError, OSError):
            raise self._gone() from None
        finally:
            self._done()
        if status != "ok":
            raise payload
        return payload

    def _done(self) -> None:
        with self._count_lock:
            self._in_flight -= 1

    def _gone(self) -> ModelProcessError:
        return ModelProcessError(
            f"the model process is gone (exit code {self.process.exitcode}): restart the server"
        )

    def close(self, timeout: float | None = 30) -> None:
        """Let the process finish its runs and exit; kill it after ``timeout`` seconds."""
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        for conn in self._conns:
            conn.close()
        self._ready.close()


# ------------------------------------------------------------------------- OpenMP's wait policy
_PASSIVE_SET_HERE = False  # passive_openmp_here() set OMP_WAIT_POLICY in this process


def passive_openmp_here() -> None:
    """Ask for OpenMP threads that sleep when idle in this process, unless the user chose a policy;
    call it before torch loads OpenMP (``layerwise serve`` does, before loading its models).

    Where the model runs in the server's own process, a spinning OpenMP thread took the core the
    event loop needed between runs (+8-10 % tokens/s at 32 clients with passive threads). The model
    process is started without it (:func:`_model_process_environment`): there nothing else needs a
    core, and passive threads must be woken for every parallel region, which made a one-text run on
    two threads take 18 ms instead of 7 on a 2-core Xeon (ad-hoc timing of ``compute``)."""
    global _PASSIVE_SET_HERE
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        _PASSIVE_SET_HERE = True


@contextlib.contextmanager
def _model_process_environment():
    """This process's environment without the OpenMP policy layerwise set here (a user's stays), for
    the model process to inherit while it is started."""
    removed = os.environ.pop("OMP_WAIT_POLICY", None) if _PASSIVE_SET_HERE else None
    try:
        yield
    finally:
        if removed is not None:
            os.environ["OMP_WAIT_POLICY"] = removed


def _threads() -> int:
    import torch

    return torch.get_num_threads()


# ------------------------------------------------------------------------------------ the process
def _main(specs: Mapping[str, Settings], conns: list[Connection], ready: Connection, threads: int) -> None:
    import signal

    import torch

    # Ctrl-C reaches the whole process group: the server drains its requests, then closes our pipes
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(threads)
    try:
        encoders = {name: _load(spec) for name, spec in specs.items()}
    except BaseException as exc:  # the server reports it and does not start
        ready.send(("error", _picklable(exc)))
        return
    per_stream = max(1, threads // len(conns))
    workers = [
        threading.Thread(
            target=_serve, args=(conn, encoders, per_stream, threads), name=f"layerwise-stream-{i}"
        )
        for i, conn in enumerate(conns)
    ]
    for worker in workers:
        worker.start()
    from .._model.loading.weights_hash import weights_sha256

    ready.send(("ok", {name: weights_sha256(enc.models.current) for name, enc in encoders.items()}))
    for worker in workers:
        worker.join()


def _load(spec: Settings) -> Encoder:
    from .._encoder import Encoder

    return Encoder.from_settings(spec)


def _serve(conn: Connection, encoders: Mapping[str, Encoder], threads: int, all_threads: int) -> None:
    """Answer the runs sent on ``conn``: on ``threads`` torch threads, or on all of them for a run
    that was alone when sent (one client at a time: nothing else needs the other cores)."""

    import torch

    torch.get_num_threads()  # a thread takes torch's default on first use: have that happen first
    torch.set_num_threads(threads)
    current = threads
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the server is gone
        if message is None:
            return
        forward, encoded, finishes, alone = message
        # alone: all threads (8 clients: +15 % tokens/s in an ad-hoc interleaved A/B; a run sent
        # just after it shares the cores until this one ends)
        wanted = all_threads if alone else threads
        if wanted != current:
            torch.set_num_threads(wanted)
            current = wanted
        try:
            reply: Any = ("ok", compute(encoders[forward.model], forward, encoded, finishes))
        except BaseException as exc:
            reply = ("error", _picklable(exc))
        try:
            conn.send(reply)
        except (OSError, ValueError):
            return
        release_free_memory(every=SERVE_TRIM_EVERY_S)


def _picklable(exc: BaseException) -> BaseException:
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return ModelProcessError(f"{type(exc).__name__}: {exc}")
