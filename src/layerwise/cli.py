"""The ``layerwise`` command line. Thin: every command calls the library.

Importing this module must stay cheap (``layerwise --help`` never imports torch): the library is
imported inside the commands.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from . import __version__
from .errors import InputError, LayerwiseError, OptionError, StoreDamagedError

app = typer.Typer(
    name="layerwise",
    help="Contextual embeddings from every encoder layer of BERT-family models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
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
    """Contextual embeddings from every encoder layer of BERT-family models."""


def _check_output_file(path: Path, option: str, suffixes: tuple[str, ...] | None = None) -> None:
    """Refuse an output file that cannot be written, before any work is done."""
    from .errors import OptionError

    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise OptionError(f"{option} {str(path)!r}: use a {', '.join(suffixes[:-1])} or {suffixes[-1]} file")
    if path.is_dir():
        raise OptionError(f"{option} {str(path)!r} is a folder; give a file name")
    folder = path.parent
    if not folder.is_dir():
        raise OptionError(
            f"{option} {str(path)!r}: the folder {str(folder)!r} does not exist; create it first"
        )
    if not os.access(folder, os.W_OK):
        raise OptionError(f"{option} {str(path)!r}: the folder {str(folder)!r} is not writable")


def _fail(exc: Exception) -> typer.Exit:
    from rich.markup import escape

    # the message quotes user values ("[/bold]", "corpus [draft].txt"): never read them as markup
    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def _setup_logging(quiet: bool) -> None:
    # --quiet hides progress and the summary, never a warning: a NaN or a truncation must be seen
    level = logging.WARNING if quiet else logging.INFO
    logging.basicConfig(format="%(levelname)s: %(message)s", level=level)
    logging.getLogger("layerwise").setLevel(level)


@app.command()
def extract(
    input: Annotated[
        Path, typer.Argument(help="One text per line (.txt), pairs (.tsv), or JSONL with 'text'")
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output file: .npz or .jsonl")],
    model: ModelOption = None,
    layers: LayersOption = "all",
    batch_size: Annotated[
        int, typer.Option("--batch-size", "-b", min=1, help="Most inputs per forward pass")
    ] = 128,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Most tokens per forward pass (padded ones with --no-packed) "
            "[default: 2048 on CPU, 32768 on GPU]",
        ),
    ] = None,
    dtype: Annotated[
        OutDtype | None,
        typer.Option(
            "--dtype", help="Dtype of the written vectors [default: float16 in a store, else float32]"
        ),
    ] = None,
    model_dtype: Annotated[ModelDtype, typer.Option(help="Compute dtype of the model")] = ModelDtype.float32,
    max_length: Annotated[int | None, typer.Option(help="Tokens per input [default: model maximum]")] = None,
    method: Annotated[MethodChoice, typer.Option(help="output_hidden_states or forward hooks")] = (
        MethodChoice.hidden_states
    ),
    packed: Annotated[
        bool,
        typer.Option(help="Unpadded forward where the architecture allows it (same numbers; see README)"),
    ] = True,
    pool: Annotated[
        str,
        typer.Option(
            "--pool", "-p", help="token | word:first|last|mean|first_last|max | sentence:cls|mean|max"
        ),
    ] = "token",
    fuse: Annotated[
        str | None,
        typer.Option(
            "--fuse",
            help="Fuse layers (word/sentence pooling): embeddings, last, second_to_last, sum_last4, "
            "mean_last4, concat_last4, sum_all, mean_all; or mean, sum, concat over --layers",
        ),
    ] = None,
    special_tokens: Annotated[
        SpecialTokensChoice, typer.Option(help="Sentence pooling over [CLS]/[SEP] too (include) or not")
    ] = SpecialTokensChoice.include,
    normalize: Annotated[
        bool,
        typer.Option(
            "--normalize", help="L2-normalise sentence vectors (as sentence-transformers' Normalize)"
        ),
    ] = False,
    long_texts: LongTextsOption = LongTextsChoice.truncate,
    stride: Annotated[
        int | None, typer.Option(min=1, help="Window step in tokens [default: half a window]")
    ] = None,
    device: DeviceOption = "auto",
    streams: StreamsOption = None,
    encoding_errors: EncodingErrorsOption = EncodingErrorsChoice.strict,
    overwrite: Annotated[
        bool, typer.Option(help="Start an existing store again instead of resuming it")
    ] = False,
    block_size: Annotated[
        int,
        typer.Option(
            min=1, help="Store: texts sorted and committed together", rich_help_panel="Store layout"
        ),
    ] = 2048,
    chunk_rows: Annotated[
        int, typer.Option(min=1, help="Store: rows per chunk", rich_help_panel="Store layout")
    ] = 128,
    shard_chunks: Annotated[
        int, typer.Option(min=1, help="Store: chunks per shard (one file)", rich_help_panel="Store layout")
    ] = 64,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Run on Ray: local (start one here) or auto (join a cluster); writes a sharded store",
            rich_help_panel="Ray",
        ),
    ] = None,
    workers: Annotated[
        int, typer.Option(min=1, help="Ray actors, each with its model", rich_help_panel="Ray")
    ] = 2,
    threads_per_worker: Annotated[
        int, typer.Option(min=1, help="torch threads (CPUs) per actor", rich_help_panel="Ray")
    ] = 1,
    shard_size: Annotated[
        int | None,
        typer.Option(
            min=1, help="Texts per shard [default: ~32 shards of 1024..4096]", rich_help_panel="Ray"
        ),
    ] = None,
    allow_nan: Annotated[
        bool,
        typer.Option("--allow-nan", help="Keep NaN/inf hidden states (with a warning) instead of an error"),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress bar or summary (warnings and errors show)")
    ] = False,
) -> None:
    """Extract hidden states of every requested layer for each input and write them to a file
    (.npz, .jsonl) or to a resumable store (a folder ending in .lw)."""
    _setup_logging(quiet)
    try:
        from .encoder import Encoder
        from .plan import OutputPlan
        from .readers import read_input_file
        from .writers import extract_to_file, output_format

        to_store = output.suffix.lower() == ".lw" or output.is_dir()
        if not to_store:
            output_format(output)  # fail on bad options before loading anything
        if output.exists() and input.exists() and os.path.samefile(output, input):
            raise OptionError(
                f"the output {str(output)!r} is the input file; writing it would replace your data: "
                "choose another output path"
            )
        default_dtype = OutDtype.float16 if to_store else OutDtype.float32
        plan = OutputPlan.parse(
            layers=layers, pool=pool, fuse=fuse, special_tokens=special_tokens.value,
            dtype=(dtype or default_dtype).value, normalize=normalize,
        )  # fmt: skip
        data = read_input_file(input, encoding_errors=encoding_errors.value)
        if not len(data):
            raise InputError(f"{input} holds no texts")
        if ray is not None:
            if not to_store:
                raise OptionError("--ray writes a sharded store: give -o a folder ending in .lw")
            _extract_on_ray(ray, data, output, plan, model, workers, threads_per_worker, shard_size, device,
                            max_length, long_texts.value, stride, overwrite, quiet)  # fmt: skip
            return
        started = time.perf_counter()
        _use_available_cores()  # before the Encoder: its default streams follow the thread count
        enc = Encoder(model, device=device, model_dtype=model_dtype.value, max_length=max_length,
                      batch_size=batch_size, max_tokens=max_tokens, packed=packed,
                      streams=streams, allow_nan=allow_nan)  # fmt: skip
        pairs, progress = data.text_pairs, False if quiet else None
        if to_store:
            from .store import extract_to_store

            stored = extract_to_store(
                enc, data.texts, output, plan, text_pairs=pairs, long_texts=long_texts.value, stride=stride,
                method=method.value, overwrite=overwrite, block_size=block_size, chunk_rows=chunk_rows,
                shard_chunks=shard_chunks, source=str(input), progress=progress,
            )  # fmt: skip
            if not quiet:
                _report_store(stored, enc.name)
            return
        summary = extract_to_file(
            enc, data.texts, output, plan, text_pairs=pairs, long_texts=long_texts.value, stride=stride,
            method=method.value, source=str(input), progress=progress,
        )  # fmt: skip
    except LayerwiseError as exc:
        raise _fail(exc) from None
    if not quiet:
        _report_file(summary, data.texts, plan.hidden_states(enc.n_hidden_states), enc, output, started)


def _extract_on_ray(mode, data, output, plan, model, workers, threads, shard_size, device, max_length,
                    long_texts, stride, overwrite, quiet) -> None:  # fmt: skip
    from . import ray as lw_ray

    if device == "auto":
        device = "cpu"  # each actor gets CPUs from Ray; pass --device cuda for GPU actors
    lw_ray.init(mode, workers=workers, threads_per_worker=threads)
    summary = lw_ray.extract_to_store(
        data.texts, output, plan, text_pairs=data.text_pairs, model=model, workers=workers,
        threads_per_worker=threads, shard_size=shard_size, device=device, max_length=max_length,
        long_texts=long_texts, stride=stride, overwrite=overwrite,
    )  # fmt: skip
    if not quiet:
        resumed = f" ({summary.n_shards_skipped} already complete)" if summary.n_shards_skipped else ""
        err.print(
            f"stored {summary.n_texts} texts in {summary.n_shards} shards{resumed}, {summary.n_rows} rows, "
            f"in {summary.path} in {summary.seconds:.1f} s with {workers} Ray actors",
            highlight=False,
            soft_wrap=True,
        )


def _report_file(summary: dict, texts, layers, enc, output: Path, started: float) -> None:
    seconds = time.perf_counter() - started
    empty = sum(1 for t in texts if not t.strip())
    notes = []
    if summary["n_truncated"]:
        notes.append(f"{summary['n_truncated']} truncated to {enc.max_length} tokens")
    if summary["n_words"]:
        notes.append(f"{summary['n_words']} words")
    if empty:
        notes.append(f"{empty} empty")
    err.print(
        f"wrote {summary['n_texts']} input(s), {summary['n_tokens']} tokens x {len(layers)} layers "
        f"of {enc.name} to {output} in {seconds:.1f} s" + (f" ({'; '.join(notes)})" if notes else ""),
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def show(
    text: Annotated[str, typer.Argument(help="The text to show")],
    pair: Annotated[
        str | None, typer.Option("--pair", help="Second segment: [CLS] TEXT [SEP] PAIR [SEP]")
    ] = None,
    model: ModelOption = None,
    layers: LayersOption = "all",
    device: DeviceOption = "auto",
) -> None:
    """Print a tokens x layers table: vector norm and cosine to the previous layer."""
    _setup_logging(quiet=True)
    try:
        from .encoder import Encoder
        from .show import layer_table

        enc = Encoder(model, device=device)
        stack = enc.extract([text], text_pairs=[pair] if pair is not None else None, layers=layers)[0]
    except LayerwiseError as exc:
        raise _fail(exc) from None
    table = layer_table(stack, model=enc.name)
    console = Console()
    needed = Console(width=10_000).measure(table).maximum
    # a pipe or a narrow terminal would squeeze the token column away; print at the table's width
    Console(width=max(console.width, needed)).print(table)


@app.command()
def verify(
    store: Annotated[Path, typer.Argument(help="A store folder (*.lw)")],
) -> None:
    """Check a store: offsets, manifest, shards and every text's checksum. Exit 1 if it is damaged."""
    try:
        from .store import verify_store

        report = verify_store(store)
    except StoreDamagedError as exc:  # a sharded store's table that cannot be trusted: damaged too
        from rich.markup import escape

        err.print(f"[bold red]DAMAGED:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=1) from None
    except LayerwiseError as exc:
        raise _fail(exc) from None
    (Console() if report.ok else err).print(str(report), highlight=False, markup=False, soft_wrap=True)
    if not report.ok:
        raise typer.Exit(code=1)


def _use_available_cores() -> None:
    """torch counts the machine's cores; a container or taskset may allow fewer."""

    import torch

    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if torch.get_num_threads() > available:
        torch.set_num_threads(available)


def _report_store(summary, model: str) -> None:
    if summary.n_written == 0 and summary.n_already_committed == summary.n_texts:
        err.print(
            f"{summary.path} is complete: {summary.n_texts} texts of {model}; nothing to do", highlight=False
        )
        return
    resumed = f" (resumed after {summary.n_already_committed} committed texts)" if summary.resumed else ""
    err.print(
        f"stored {summary.n_written} texts{resumed}, {summary.n_rows} rows of {model} in {summary.path} "
        f"in {summary.seconds:.1f} s" + (f"; {summary.n_truncated} truncated" if summary.n_truncated else ""),
        highlight=False,
        soft_wrap=True,
    )


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM (kill, systemd, a batch scheduler) unwinds like Ctrl-C: temp files are removed and
    a store's background writer stops after its current commit."""
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


# the other commands register themselves on ``app`` (imported last: they import from this module)
from . import cli_analysis, cli_probe, cli_serve  # noqa: E402, F401

if __name__ == "__main__":  # python -m layerwise.cli: run the imported module, where commands registered
    from layerwise.cli import main as _main

    _main()
