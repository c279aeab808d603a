"""What every command shares: the Typer app they register on (each command reports layerwise's
errors in one place: :class:`ReportingTyper`), the error console, and the helpers that set up
logging, size torch's threads and check an output file before any work.

Importing this module must stay cheap (``layerwise --help`` never imports torch).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from .._version import __version__
from ..errors import LayerwiseError, OptionError


class ReportingTyper(typer.Typer):
    """A Typer whose commands report a LayerwiseError as one ``error: …`` line (exit 2) or
    ``DAMAGED: …`` (exit 1, damage found on disk) instead of a traceback: one handler for every
    command, none written in a command."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable], Callable]:  # type: ignore[override]
        register = super().command(*args, **kwargs)

        def decorate(function: Callable) -> Callable:
            @functools.wraps(function)  # Typer reads the options from the wrapped signature
            def reported(*given: Any, **options: Any) -> Any:
                try:
                    return function(*given, **options)
                except LayerwiseError as exc:
                    raise fail(exc) from None

            register(reported)
            return function

        return decorate


app = ReportingTyper(
    name="layerwise",
    help="Contextual embeddings from every layer of transformer encoders (BERT family) and decoder LMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: it wraps at any width, where rich cut values at 80 columns
)
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"layerwise {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Contextual embeddings from every layer of transformer encoders (BERT family) and decoder LMs."""


def check_output_file(path: Path, option: str, suffixes: tuple[str, ...] | None = None) -> None:
    """Refuse an output file that cannot be written, before any work is done."""

    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise OptionError(f"{option} {str(path)!r}: use a {', '.join(suffixes[:-1])} or {suffixes[-1]} file")
    if path.is_dir():
        raise OptionError(f"{option} {str(path)!r} is a folder; give a file name")
    folder = path.parent
    if folder.exists() and not folder.is_dir():
        raise OptionError(f"{option} {str(path)!r}: {str(folder)!r} is a file, not a folder; name a file")
    if not folder.is_dir():
        raise OptionError(
            f"{option} {str(path)!r}: the folder {str(folder)!r} does not exist; create it first"
        )
    # the only proof that a file can be made there (root passes os.access; /proc refuses anyway)
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".layerwise-", suffix=".tmp"):
            pass
    except OSError as exc:
        raise OptionError(
            f"{option} {str(path)!r}: a file cannot be written in {str(folder)!r} ({exc.strerror or exc}); "
            "choose another folder"
        ) from None


def fail(exc: Exception) -> typer.Exit:
    """Print ``exc`` and the exit to raise: 1 for damage found on disk (as ``verify`` reports it),
    2 for everything else a user can fix by changing the command."""
    from rich.markup import escape

    from ..errors import StoreDamagedError

    # the message quotes user values ("[/bold]", "corpus [draft].txt"): never read them as markup
    if isinstance(exc, StoreDamagedError):
        err.print(f"[bold red]DAMAGED:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return typer.Exit(code=1)
    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def setup_logging(quiet: bool) -> None:
    # --quiet hides progress and the summary, never a warning: a NaN or a truncation must be seen
    level = logging.WARNING if quiet else logging.INFO
    logging.basicConfig(format="%(levelname)s: %(message)s", level=level)
    logging.getLogger("layerwise").setLevel(level)


def use_available_cores() -> None:
    """torch counts the machine's cores; a container or taskset may allow fewer."""

    import torch

    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if torch.get_num_threads() > available:
        torch.set_num_threads(available)
