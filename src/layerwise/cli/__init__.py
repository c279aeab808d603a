"""The ``layerwise`` command line. Thin: every command calls the library.

One module per command group (extract, inspect, analysis, probe, serve), each registering its
commands on the app in ``options``, which holds what they share. Importing this package stays
cheap: ``layerwise --help`` never imports torch.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys

from . import _analysis, _cache, _extract, _inspect, _layers, _probe, _serve  # noqa: F401  (they register their commands)
from ._shared import app, err

__all__ = ["app", "main"]


TERMINATED = 128 + signal.SIGTERM


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM (kill, systemd, a batch scheduler) unwinds like Ctrl-C: temp files are removed and
    a store's background writer stops after its current commit."""
    raise SystemExit(128 + signum)


def _exit_terminated() -> None:
    """Leave a terminated run at once, its unwinding done: the exit functions run (temporary folders,
    logging), then the process ends without joining worker threads. A forward stream or reader
    thread caught mid-batch, or waiting on a lock the interrupted main thread held, would otherwise
    keep the interpreter's shutdown waiting for it."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(TERMINATED)


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except SystemExit as stop:
        if stop.code == TERMINATED:
            _exit_terminated()
        raise
