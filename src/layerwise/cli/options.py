"""What every command shares: the Typer app they register on, the option types and choices, and
the helpers that report errors, set up logging and size torch's threads.

Importing this module must stay cheap (``layerwise --help`` never imports torch): the library is
imported inside the commands.
"""

from __future__ import annotations

import logging
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from .. import __version__
from ..errors import OptionError

app = typer.Typer(
    name="layerwise",
    help="Contextual embeddings from every layer of transformer encoders (BERT family) and decoder LMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: it wraps at any width, where rich cut values at 80 columns
)
err = Console(stderr=True)


class OutDtype(StrEnum):
    float32 = "float32"
    float16 = "float16"


class ModelDtype(StrEnum):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


class MethodChoice(StrEnum):
    hidden_states = "hidden_states"
    hooks = "hooks"


class SpecialTokensChoice(StrEnum):
    include = "include"
    exclude = "exclude"


class LongTextsChoice(StrEnum):
    truncate = "truncate"
    window = "window"


class EncodingErrorsChoice(StrEnum):
    strict = "strict"
    replace_invalid = "replace"  # not "replace": that would hide str.replace


LongTextsOption = Annotated[
    LongTextsChoice, typer.Option(help="Inputs over the model maximum: truncate, or sliding windows")
]
EncodingErrorsOption = Annotated[
    EncodingErrorsChoice, typer.Option(help="strict: stop at invalid UTF-8; replace: use U+FFFD")
]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model", "-m", help="Hugging Face name or local folder [default: packaged all-MiniLM-L6-v2]"
    ),
]
LayersOption = Annotated[
    str, typer.Option("--layers", "-l", help="all | -1 | 0,4,-1 | 0:4 (end excluded) | last4; 0 = embeddings")
]
DeviceOption = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N")]


class FinalNormChoice(StrEnum):
    last = "last"
    none = "none"
    all = "all"


FinalNormOption = Annotated[
    FinalNormChoice | None,
    typer.Option(
        help="Decoder LMs: the final norm on the last hidden state (last, as transformers returns it), "
        "on none, or on all (layers compare on one scale) [default: last]; encoders have none"
    ),
]


def final_norm_value(choice: FinalNormChoice | None):
    """The Python value of --final-norm (None: not given, the model's default)."""
    from ..settings import parse_final_norm

    return True if choice is None else parse_final_norm(choice.value)


StreamsOption = Annotated[
    int | None,
    typer.Option(
        min=1, help="Packed batches run at once on the CPU [default: 2 for models up to 512 wide, 2+ cores]"
    ),
]


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


def _check_output_file(path: Path, option: str, suffixes: tuple[str, ...] | None = None) -> None:
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


def _fail(exc: Exception) -> typer.Exit:
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


def _setup_logging(quiet: bool) -> None:
    # --quiet hides progress and the summary, never a warning: a NaN or a truncation must be seen
    level = logging.WARNING if quiet else logging.INFO
    logging.basicConfig(format="%(levelname)s: %(message)s", level=level)
    logging.getLogger("layerwise").setLevel(level)


def _use_available_cores() -> None:
    """torch counts the machine's cores; a container or taskset may allow fewer."""

    import torch

    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if torch.get_num_threads() > available:
        torch.set_num_threads(available)
