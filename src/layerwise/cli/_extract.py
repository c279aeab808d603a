"""``layerwise extract`` (a corpus in, vectors out: a file or a store) and ``layerwise export``
(a store's token rows, pooled, out as a file)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .._settings.extras import require, require_for_files
from .._settings.settings import Settings
from ..errors import InputError, OptionError
from ._groups import (
    ALL_COLUMNS,
    DEFAULT_LAYOUT,
    DEFAULT_PLAN,
    NO_RAY,
    CorpusColumns,
    LayoutOptions,
    PlanOptions,
    RayOptions,
    corpus_options,
    layout_options,
    plan_options,
    ray_options,
)
from ._options import MODEL_SETTINGS, model_options
from ._shared import app, check_output_file, err, setup_logging, use_available_cores

if TYPE_CHECKING:
    from .._features.plan import OutputPlan
    from .._inputs.corpus import Corpus

NoTextOption = Annotated[
    bool, typer.Option("--no-text", help="Leave the texts out of the output (ids only): a smaller file")
]
QuietOption = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress bar or summary (warnings and errors show)")
]


@app.command()
@model_options()
@ray_options()
@layout_options()
@corpus_options()
@plan_options(pool="token", dtype_default="float16 in a store, else float32", windows=True)
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
    no_text: NoTextOption = False,
    overwrite: Annotated[
        bool, typer.Option(help="Start an existing store again instead of resuming it")
    ] = False,
    quiet: QuietOption = False,
    plan_options: PlanOptions = DEFAULT_PLAN,  # --layers, --pool and the rest of the plan (@plan_options)
    columns: CorpusColumns = ALL_COLUMNS,  # the corpus options (@corpus_options)
    layout: LayoutOptions = DEFAULT_LAYOUT,  # the store's layout (@layout_options)
    ray: RayOptions = NO_RAY,  # --ray and its options (@ray_options)
    settings: Settings = MODEL_SETTINGS,  # the model options (@model_options)
) -> None:
    """Extract hidden states of every requested layer for each input and write them to a file
    (.npz, .jsonl, .parquet for pooled vectors) or to a resumable store (a folder ending in .lw).
    The output's metadata records how it was made: `layerwise info OUTPUT`."""
    setup_logging(quiet)
    to_store = _is_store_output(output)
    on_ray = ray.mode is not None
    backend = "--ray" if on_ray else ("a store (-o *.lw)" if to_store else f"a {output.suffix} file")
    _refuse_unused(
        backend,
        to_store=to_store,
        on_ray=on_ray,
        no_text=no_text,
        overwrite=overwrite,
        layout=layout.given(),
        ray_only=ray.given(),
    )
    plan = plan_options.plan("float16" if to_store else "float32")
    corpus = _checked_corpus(_corpus_of(inputs, columns, settings), output, plan, to_store, on_ray)
    if ray.mode is not None:
        _extract_on_ray(ray.mode, ray, settings, corpus, output, plan, overwrite, layout.layout(), quiet)
        return
    from .._encoder import Encoder

    started = time.perf_counter()
    use_available_cores()  # before the Encoder: its default concurrent forwards follow the thread count
    if not quiet:  # a model takes seconds to load (a GGUF file ten): say what is happening
        err.print(f"loading {settings.model or 'the packaged all-MiniLM-L6-v2'} …", highlight=False)
    enc = Encoder.from_settings(settings)
    progress = False if quiet else None
    if to_store:
        from ..store import extract_to_store

        stored = extract_to_store(
            enc,
            corpus,
            output,
            plan,
            layout=layout.layout(),
            overwrite=overwrite,
            source=corpus.describe(),
            progress=progress,
        )
        if not quiet:
            _report_store(stored, enc.name, corpus.scan().n_skipped, enc.modality)
        return
    from .._files.writers import extract_to_file

    summary = extract_to_file(
        enc, corpus, output, plan, source=corpus.describe(), progress=progress, keep_text=not no_text
    )
    if not quiet:
        layers = plan.hidden_states(enc.n_hidden_states)
        _report_file(summary, layers, enc.name, enc.max_length, output, started, enc.modality)


def _corpus_of(inputs: list[str], columns: CorpusColumns, settings: Settings) -> Corpus:
    """The inputs as a corpus: for a model that reads images or sound, its files, folders and globs
    are the inputs themselves (a table's column of paths is read as a text column, of paths); else
    the texts of the files."""
    from .._inputs.media_sources import corpus_of, names_files_of
    from .._model.loading.source import modality_of

    modality = modality_of(settings)
    if modality != "text" and all(names_files_of(name, modality) for name in inputs):
        return corpus_of(inputs, modality)
    return columns.corpus(inputs)


def _is_store_output(output: Path) -> bool:
    """-o names a store: a path ending in .lw, or a folder. A folder named like a file format (d.npz)
    is refused: a store written into it would be taken for the file its name promises."""
    suffix = output.suffix.lower()
    if output.is_dir() and suffix in (".npz", ".jsonl", ".parquet", ".json", ".csv", ".txt", ".tsv"):
        raise OptionError(
            f"-o {str(output)!r} is a folder, but {suffix} names a file format: give a file path (e.g. "
            f"{str(output / ('vectors' + suffix))!r}), or a store folder ending in .lw"
        )
    return suffix == ".lw" or output.is_dir()


def _checked_corpus(corpus: Corpus, output: Path, plan: OutputPlan, to_store: bool, on_ray: bool) -> Corpus:
    """What fails without the model fails before it loads: an extra the output needs, the output's
    format against the plan, an output path that cannot be written, an output that is one of the
    inputs, and a corpus without texts (its every row is read once)."""
    if to_store:
        require("distributed" if on_ray else "store")
    else:
        from .._files.writers import output_format

        output_format(output, plan.level)
        check_output_file(output, "-o")
        require_for_files([output], "-o")
    for path in corpus.files if output.exists() else ():
        if os.path.samefile(output, path):
            raise OptionError(
                f"the output {str(output)!r} is the input file; writing it would replace your data: "
                "choose another output path"
            )
    if not len(corpus):
        skipped = corpus.scan().n_skipped
        raise InputError(
            f"{corpus.describe()} holds no texts" + (f" ({skipped} bad rows skipped)" if skipped else "")
        )
    return corpus


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


def _extract_on_ray(
    mode: str, ray: RayOptions, settings, data, output, plan, overwrite, layout, quiet
) -> None:
    from .. import ray as lw_ray

    workers, threads = ray.sizes()
    lw_ray.init(mode, workers=workers, threads_per_worker=threads)
    summary = lw_ray.extract_to_store(
        settings,
        data,
        output,
        plan,
        layout=layout,
        workers=workers,
        threads_per_worker=threads,
        shard_size=ray.shard_size,
        overwrite=overwrite,
    )
    if not quiet:
        resumed = f" ({summary.n_shards_skipped} already complete)" if summary.n_shards_skipped else ""
        err.print(
            f"stored {summary.n_texts} texts in {summary.n_shards} shards{resumed}, {summary.n_rows} rows, "
            f"in {summary.path} in {summary.seconds:.1f} s with {workers} Ray actors (planned in "
            f"{summary.plan_seconds:.1f} s)",
            highlight=False,
            soft_wrap=True,
        )


# what a run's summaries call an input and its units, by what the model reads
_NOUNS = {"text": ("texts", "tokens"), "image": ("images", "units"), "audio": ("clips", "frames")}


def _report_file(
    summary: dict, layers, model: str, max_length: int | None, output: Path, started: float, modality: str
) -> None:
    seconds = time.perf_counter() - started
    units = _NOUNS[modality][1]
    notes = []
    if summary["n_truncated"]:
        notes.append(f"{summary['n_truncated']} truncated to {max_length} {units}")
    if summary["n_words"]:
        notes.append(f"{summary['n_words']} words")
    if summary.get("n_empty"):
        notes.append(f"{summary['n_empty']} empty")
    if summary.get("n_skipped"):
        notes.append(f"{summary['n_skipped']} bad rows skipped")
    err.print(
        f"wrote {summary['n_texts']} input(s), {summary['n_tokens']} {units} x {len(layers)} layers "
        f"of {model} to {output} in {seconds:.1f} s" + (f" ({'; '.join(notes)})" if notes else ""),
        highlight=False,
        soft_wrap=True,
    )


def _report_store(summary, model: str, n_skipped: int = 0, modality: str = "text") -> None:
    inputs = _NOUNS[modality][0]
    if summary.n_written == 0 and summary.n_already_committed == summary.n_texts:
        said = f"{summary.path} is complete: {summary.n_texts} {inputs} of {model}; nothing to do"
        err.print(said, highlight=False)
        return
    resumed = f" (resumed after {summary.n_already_committed} committed {inputs})" if summary.resumed else ""
    err.print(
        f"stored {summary.n_written} {inputs}{resumed}, {summary.n_rows} rows of {model} in {summary.path} "
        f"in {summary.seconds:.1f} s"
        + (f"; {summary.n_truncated} truncated" if summary.n_truncated else "")
        + (f"; {n_skipped} bad rows skipped" if n_skipped else ""),
        highlight=False,
        soft_wrap=True,
    )


@app.command()
@plan_options(pool="sentence:mean", dtype_default="float32", windows=False)
def export(
    store: Annotated[Path, typer.Argument(help="A token-level store (*.lw)")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output: .parquet, .npz or .jsonl")],
    no_text: NoTextOption = False,
    quiet: QuietOption = False,
    plan_options: PlanOptions = DEFAULT_PLAN,  # --layers, --pool and the rest of the plan (@plan_options)
) -> None:
    """Pool a token-level store's rows into pooled vectors (.parquet, .npz, .jsonl) without the model:
    the store holds the tokens, offsets and word ids pooling needs."""
    setup_logging(quiet)
    started = time.perf_counter()
    from .._files.export import export_store

    require("store")
    require_for_files([output], "-o")  # before the store's rows are pooled, not after
    plan = plan_options.plan("float32")
    summary = export_store(store, output, plan, keep_text=not no_text, progress=False if quiet else None)
    if not quiet:
        err.print(
            f"exported {summary['n_texts']} texts ({plan.pool}) from {store} to {output} in "
            f"{time.perf_counter() - started:.1f} s",
            highlight=False,
            soft_wrap=True,
        )
