"""``layerwise extract`` (a corpus in, vectors out: a file or a store) and ``layerwise export``
(a store's token rows, pooled, out as a file)."""

from __future__ import annotations

import os
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from ..errors import InputError, LayerwiseError, OptionError
from ..features.names import FUSE_HELP, POOL_HELP
from ..settings import Settings
from .options import (
    MODEL_SETTINGS,
    EncodingErrorsChoice,
    EncodingErrorsOption,
    LayersOption,
    LongTextsChoice,
    LongTextsOption,
    OutDtype,
    SpecialTokensChoice,
    _fail,
    _setup_logging,
    _use_available_cores,
    app,
    err,
    model_options,
)


class FormatChoice(StrEnum):
    txt = "txt"
    tsv = "tsv"
    jsonl = "jsonl"
    csv = "csv"
    parquet = "parquet"


# a corpus' text column and format, as every command that reads one names them
TextColumnOption = Annotated[
    str | None, typer.Option(help="The column of the texts (CSV, Parquet) [default: text]")
]
InputFormatOption = Annotated[
    FormatChoice | None, typer.Option("--format", help="Input format [default: from the suffix]")
]


class BadRowChoice(StrEnum):
    error = "error"
    skip = "skip"


INPUT_PANEL = "Input columns"
PoolOption = Annotated[
    str,
    typer.Option("--pool", "-p", help=POOL_HELP),
]
FuseOption = Annotated[
    str | None,
    typer.Option(
        "--fuse",
        help=f"Fuse layers (word/sentence pooling): {FUSE_HELP} (--layers)",
    ),
]
NoTextOption = Annotated[
    bool, typer.Option("--no-text", help="Leave the texts out of the output (ids only): a smaller file")
]


@app.command()
@model_options()
def extract(
    inputs: Annotated[
        list[str],
        typer.Argument(
            help="Files, globs or folders (.txt, .tsv, .jsonl, .csv, .parquet; .gz/.zst/.bz2/.xz), "
            "or - for standard input with --format",
            show_default=False,
        ),
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Output: .npz, .jsonl, .parquet (pooled) or a store (*.lw)")
    ],
    layers: LayersOption = "all",
    dtype: Annotated[
        OutDtype | None,
        typer.Option(
            "--dtype", help="Dtype of the written vectors [default: float16 in a store, else float32]"
        ),
    ] = None,
    pool: PoolOption = "token",
    fuse: FuseOption = None,
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
    encoding_errors: EncodingErrorsOption = EncodingErrorsChoice.strict,
    format: Annotated[
        FormatChoice | None,
        typer.Option("--format", help="Input format [default: from the suffix]", rich_help_panel=INPUT_PANEL),
    ] = None,
    text_column: Annotated[
        str | None, typer.Option(help="Column (field) holding the text", rich_help_panel=INPUT_PANEL)
    ] = None,
    pair_column: Annotated[
        str | None, typer.Option(help="Column holding a second segment: a pair", rich_help_panel=INPUT_PANEL)
    ] = None,
    id_column: Annotated[
        str | None,
        typer.Option(
            help="Column holding each row's id [default: the 0-based row]", rich_help_panel=INPUT_PANEL
        ),
    ] = None,
    words_column: Annotated[
        str | None,
        typer.Option(help="List column of pre-split words (instead of a text)", rich_help_panel=INPUT_PANEL),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option(min=1, help="Only the first N texts: try before you run", rich_help_panel=INPUT_PANEL),
    ] = None,
    on_bad_row: Annotated[
        BadRowChoice,
        typer.Option(
            help="A null or non-text row: stop before writing (error), or skip and count it",
            rich_help_panel=INPUT_PANEL,
        ),
    ] = BadRowChoice.error,
    no_text: NoTextOption = False,
    overwrite: Annotated[
        bool, typer.Option(help="Start an existing store again instead of resuming it")
    ] = False,
    block_size: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Store: texts sorted and committed together [default: 2048]",
            rich_help_panel="Store layout",
        ),
    ] = None,
    chunk_rows: Annotated[
        int | None,
        typer.Option(min=1, help="Store: rows per chunk [default: 128]", rich_help_panel="Store layout"),
    ] = None,
    shard_chunks: Annotated[
        int | None,
        typer.Option(
            min=1, help="Store: chunks per shard (one file) [default: 64]", rich_help_panel="Store layout"
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Run on Ray: local (start one here) or auto (join a cluster); writes a sharded store",
            rich_help_panel="Ray",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, help="Ray actors, each with its model [default: 2]", rich_help_panel="Ray"),
    ] = None,
    threads_per_worker: Annotated[
        int | None,
        typer.Option(min=1, help="torch threads (CPUs) per actor [default: 1]", rich_help_panel="Ray"),
    ] = None,
    shard_size: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Texts per shard [default: ~32 shards of 1024..4096, one per worker at least]",
            rich_help_panel="Ray",
        ),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress bar or summary (warnings and errors show)")
    ] = False,
    settings: Settings = MODEL_SETTINGS,  # the model options (@model_options)
) -> None:
    """Extract hidden states of every requested layer for each input and write them to a file
    (.npz, .jsonl, .parquet for pooled vectors) or to a resumable store (a folder ending in .lw).
    The output's metadata records how it was made: `layerwise info OUTPUT`."""
    _setup_logging(quiet)
    try:
        from ..features.plan import OutputPlan

        to_store = output.suffix.lower() == ".lw" or output.is_dir()
        backend = (
            "--ray" if ray is not None else ("a store (-o *.lw)" if to_store else f"a {output.suffix} file")
        )
        _refuse_unused(
            backend, to_store=to_store, on_ray=ray is not None, no_text=no_text, overwrite=overwrite,
            layout={"--block-size": block_size, "--chunk-rows": chunk_rows, "--shard-chunks": shard_chunks},
            ray_only={"--workers": workers, "--threads-per-worker": threads_per_worker,
                      "--shard-size": shard_size},
        )  # fmt: skip
        if not to_store:
            from ..files.writers import output_format

            output_format(output)  # fail on bad options before loading anything
        for name in inputs:
            if output.exists() and Path(name).exists() and os.path.samefile(output, name):
                raise OptionError(
                    f"the output {str(output)!r} is the input file; writing it would replace your data: "
                    "choose another output path"
                )
        default_dtype = OutDtype.float16 if to_store else OutDtype.float32
        plan = OutputPlan.parse(
            layers=layers,
            pool=pool,
            fuse=fuse,
            special_tokens=special_tokens.value,
            dtype=(dtype or default_dtype).value,
            normalize=normalize,
            long_texts=long_texts.value,
            stride=stride,
        )  # fmt: skip  (its final norm: the settings' (--final-norm), the one value every back end takes
        if output.suffix.lower() == ".parquet":
            from ..files.parquet import check_parquet_plan

            check_parquet_plan(plan.level)
        from ..inputs.corpus import Corpus

        corpus = Corpus(
            inputs, format=format.value if format else None, text_column=text_column, pair_column=pair_column,
            id_column=id_column, words_column=words_column, limit=limit, on_bad_row=on_bad_row.value,
            encoding_errors=encoding_errors.value,
        )  # fmt: skip
        if not len(corpus):  # reads every row once: a bad one stops here, before the model loads
            skipped = corpus.scan().n_skipped
            raise InputError(
                f"{corpus.describe()} holds no texts" + (f" ({skipped} bad rows skipped)" if skipped else "")
            )
        source = corpus.describe()
        from ..store.format import BLOCK_SIZE, CHUNK_ROWS, SHARD_CHUNKS, StoreLayout

        layout = StoreLayout(block_size or BLOCK_SIZE, chunk_rows or CHUNK_ROWS, shard_chunks or SHARD_CHUNKS)
        if ray is not None:
            _extract_on_ray(ray, settings, corpus, output, plan, workers or 2, threads_per_worker or 1,
                            shard_size, overwrite, layout, quiet)  # fmt: skip
            return
        from ..encoder import Encoder

        started = time.perf_counter()
        _use_available_cores()  # before the Encoder: its default streams follow the thread count
        if not quiet:  # a model takes seconds to load (a GGUF file ten): say what is happening
            err.print(f"loading {settings.model or 'the packaged all-MiniLM-L6-v2'} …", highlight=False)
        enc = Encoder.from_settings(settings)
        progress = False if quiet else None
        if to_store:
            from ..store import extract_to_store

            stored = extract_to_store(enc, corpus, output, plan, layout=layout, overwrite=overwrite,
                                      source=source, progress=progress)  # fmt: skip
            if not quiet:
                _report_store(stored, enc.name, corpus.scan().n_skipped)
            return
        from ..files.writers import extract_to_file

        summary = extract_to_file(
            enc, corpus, output, plan, source=source, progress=progress, keep_text=not no_text
        )
    except LayerwiseError as exc:
        raise _fail(exc) from None
    if not quiet:
        _report_file(
            summary, plan.hidden_states(enc.n_hidden_states), enc.name, enc.max_length, output, started
        )


def _refuse_unused(
    backend: str,
    *,
    to_store: bool,
    on_ray: bool,
    no_text: bool,
    overwrite: bool,
    layout: dict,
    ray_only: dict,
) -> None:
    """Options the chosen back end cannot honour are refused, naming the option and the back end
    (tests/test_option_coverage.py walks every option through every back end)."""
    if on_ray and not to_store:
        raise OptionError("--ray writes a sharded store: give -o a folder ending in .lw")
    if no_text and to_store:
        raise OptionError(
            f"--no-text: {backend} keeps each text in its manifest (resuming and verify check them); "
            "write the store, then `layerwise export STORE -o vectors.parquet --no-text`"
        )
    if overwrite and not to_store:
        raise OptionError(f"--overwrite applies to stores; {backend} is always written anew (atomically)")
    for option, value in layout.items():
        if value is not None and not to_store:
            raise OptionError(f"{option} sets a store's layout; {backend} has none: leave {option} out")
    for option, value in ray_only.items():
        if value is not None and not on_ray:
            raise OptionError(f"{option} applies to --ray; {backend} runs in this process: add --ray local")


def _extract_on_ray(mode, settings, data, output, plan, workers, threads, shard_size, overwrite, layout,
                    quiet) -> None:  # fmt: skip
    from .. import ray as lw_ray

    lw_ray.init(mode, workers=workers, threads_per_worker=threads)
    summary = lw_ray.extract_to_store(
        settings, data, output, plan, layout=layout, workers=workers, threads_per_worker=threads,
        shard_size=shard_size, overwrite=overwrite,
    )  # fmt: skip
    if not quiet:
        resumed = f" ({summary.n_shards_skipped} already complete)" if summary.n_shards_skipped else ""
        err.print(
            f"stored {summary.n_texts} texts in {summary.n_shards} shards{resumed}, {summary.n_rows} rows, "
            f"in {summary.path} in {summary.seconds:.1f} s with {workers} Ray actors (planned in "
            f"{summary.plan_seconds:.1f} s)",
            highlight=False,
            soft_wrap=True,
        )


def _report_file(
    summary: dict, layers, model: str, max_length: int | None, output: Path, started: float
) -> None:
    seconds = time.perf_counter() - started
    notes = []
    if summary["n_truncated"]:
        notes.append(f"{summary['n_truncated']} truncated to {max_length} tokens")
    if summary["n_words"]:
        notes.append(f"{summary['n_words']} words")
    if summary.get("n_empty"):
        notes.append(f"{summary['n_empty']} empty")
    if summary.get("n_skipped"):
        notes.append(f"{summary['n_skipped']} bad rows skipped")
    err.print(
        f"wrote {summary['n_texts']} input(s), {summary['n_tokens']} tokens x {len(layers)} layers "
        f"of {model} to {output} in {seconds:.1f} s" + (f" ({'; '.join(notes)})" if notes else ""),
        highlight=False,
        soft_wrap=True,
    )


def _report_store(summary, model: str, n_skipped: int = 0) -> None:
    if summary.n_written == 0 and summary.n_already_committed == summary.n_texts:
        err.print(
            f"{summary.path} is complete: {summary.n_texts} texts of {model}; nothing to do", highlight=False
        )
        return
    resumed = f" (resumed after {summary.n_already_committed} committed texts)" if summary.resumed else ""
    err.print(
        f"stored {summary.n_written} texts{resumed}, {summary.n_rows} rows of {model} in {summary.path} "
        f"in {summary.seconds:.1f} s"
        + (f"; {summary.n_truncated} truncated" if summary.n_truncated else "")
        + (f"; {n_skipped} bad rows skipped" if n_skipped else ""),
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def export(
    store: Annotated[Path, typer.Argument(help="A token-level store (*.lw)")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output: .parquet, .npz or .jsonl")],
    layers: LayersOption = "all",
    pool: PoolOption = "sentence:mean",
    fuse: FuseOption = None,
    special_tokens: Annotated[
        SpecialTokensChoice, typer.Option(help="Sentence pooling over [CLS]/[SEP] too (include) or not")
    ] = SpecialTokensChoice.include,
    normalize: Annotated[bool, typer.Option("--normalize", help="L2-normalise sentence vectors")] = False,
    dtype: Annotated[
        OutDtype, typer.Option("--dtype", help="Dtype of the written vectors")
    ] = OutDtype.float32,
    no_text: NoTextOption = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summary")] = False,
) -> None:
    """Pool a token-level store's rows into pooled vectors (.parquet, .npz, .jsonl) without the model:
    the store holds the tokens, offsets and word ids pooling needs."""
    _setup_logging(quiet)
    started = time.perf_counter()
    try:
        from ..features.plan import OutputPlan
        from ..files.export import export_store

        plan = OutputPlan.parse(
            layers=layers, pool=pool, fuse=fuse, special_tokens=special_tokens.value, dtype=dtype.value,
            normalize=normalize,
        )  # fmt: skip
        summary = export_store(store, output, plan, keep_text=not no_text, progress=False if quiet else None)
    except LayerwiseError as exc:
        raise _fail(exc) from None
    if not quiet:
        err.print(
            f"exported {summary['n_texts']} texts ({plan.pool}) from {store} to {output} in "
            f"{time.perf_counter() - started:.1f} s",
            highlight=False,
            soft_wrap=True,
        )
