"""One way to show progress: a rich bar on stderr, shown on a terminal at log level INFO or lower,
silent otherwise (pipes, CI logs, ``--quiet``) unless asked for explicitly."""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("layerwise")


def progress_bar(label: str, unit: str, enabled: bool | None, *, extra: str | None = None):
    """A ``rich.progress.Progress`` ("label [bar] n/total unit ETA"), or None when it should stay
    quiet. ``extra`` names a task field shown after the bar (e.g. live metrics)."""
    if enabled is None:
        enabled = sys.stderr.isatty() and logger.getEffectiveLevel() <= logging.INFO
    if not enabled:
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = [TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn(unit), TimeRemainingColumn()]
    if extra is not None:
        columns.append(TextColumn(f"{{task.fields[{extra}]}}"))
    return Progress(*columns, console=Console(stderr=True), transient=True)
