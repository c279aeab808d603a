"""The option groups besides the model's: the output plan (``layerwise extract`` and ``export``),
the corpus' format and columns and the store's layout (``extract``), and Ray (``extract`` and
``cache``). Each reaches a command as one value
(``option_group``), so the command lists none of them and a new option of a group is added here
alone."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .._features.names import FUSE_HELP, POOL_HELP, OutputDtype, SpecialTokens
from .._inputs.formats import BadRow, EncodingErrors, Format
from .._settings.long_texts import LongTexts
from ._options import EncodingErrorsOption, LayersOption, group_option, group_parameter, option_group

if TYPE_CHECKING:
    from .._features.plan import OutputPlan
    from .._inputs.corpus import Corpus
    from ..store._format import StoreLayout

PLAN_PANEL = "Output plan"
INPUT_PANEL = "Input columns"
LAYOUT_PANEL = "Store layout"
RAY_PANEL = "Ray"


# a corpus' text column and format, as every command that reads one names them
TextColumnOption = Annotated[
    str | None, typer.Option(help="The column of the texts (CSV, Parquet) [default: text]")
]
InputFormatOption = Annotated[
    Format | None, typer.Option("--format", help="Input format [default: from the suffix]")
]


def _optional_int(name: str, help: str, panel: str) -> inspect.Parameter:
    return group_option(name, None, int | None, min=1, help=help, panel=panel)


@dataclass(frozen=True)
class PlanOptions:
    """What to write, as the options gave it: ``OutputPlan.parse``'s keywords; ``dtype`` None: the
    output's own default (:meth:`plan` takes it)."""

    layers: str = "all"
    pool: str = "token"
    fuse: str | None = None
    special_tokens: SpecialTokens = "include"
    normalize: bool = False
    dtype: OutputDtype | None = None
    long_texts: LongTexts = "truncate"
    stride: int | None = None

    def plan(self, default_dtype: OutputDtype) -> OutputPlan:
        """The OutputPlan; its final norm is the model options' (``--final-norm``), which every back
        end takes from the Settings."""
        from .._features.plan import OutputPlan

        given = dataclasses.asdict(self) | {"dtype": self.dtype or default_dtype}
        return OutputPlan.parse(**given)


def plan_options(*, pool: str, dtype_default: str, windows: bool) -> Callable[[Callable], Callable]:
    """--layers, --pool (default ``pool``), --fuse, --special-tokens, --normalize, --dtype (its help
    says ``dtype_default``) and, for a command that runs the model (``windows``), --long-texts and
    --stride: the command takes them as ``plan_options: PlanOptions``."""

    def option(name: str, default: object, kind: object, *flags: str, help: str) -> inspect.Parameter:
        return group_option(name, default, kind, *flags, help=help, panel=PLAN_PANEL)

    parameters = [
        group_parameter("layers", "all", LayersOption),
        option("pool", pool, str, "--pool", "-p", help=POOL_HELP),
        option(
            "fuse",
            None,
            str | None,
            "--fuse",
            help=f"Fuse layers (word/sentence pooling): {FUSE_HELP} (--layers)",
        ),
        option(
            "special_tokens",
            "include",
            SpecialTokens,
            help="Sentence pooling over [CLS]/[SEP] too (include) or not",
        ),
        option(
            "normalize",
            False,
            bool,
            "--normalize",
            help="L2-normalise sentence vectors (as sentence-transformers' Normalize)",
        ),
        option(
            "dtype",
            None,
            OutputDtype | None,
            "--dtype",
            help=f"Dtype of the written vectors [default: {dtype_default}]",
        ),
    ]
    if windows:
        parameters += [
            option(
                "long_texts",
                "truncate",
                LongTexts,
                help="Inputs over the model maximum: truncate, or sliding windows",
            ),
            _optional_int("stride", "Window step in tokens [default: half a window]", PLAN_PANEL),
        ]
    return option_group(("plan_options",), parameters, lambda **given: {"plan_options": PlanOptions(**given)})


@dataclass(frozen=True)
class CorpusColumns:
    """How the input files are read: ``lw.Corpus``'s keywords, as the options gave them."""

    format: Format | None = None
    text_column: str | None = None
    pair_column: str | None = None
    id_column: str | None = None
    words_column: str | None = None
    limit: int | None = None
    on_bad_row: BadRow = "error"
    encoding_errors: EncodingErrors = "strict"

    def corpus(self, inputs: list[str]) -> Corpus:
        from .._inputs.corpus import Corpus

        return Corpus(
            inputs,
            format=self.format,
            text_column=self.text_column,
            pair_column=self.pair_column,
            id_column=self.id_column,
            words_column=self.words_column,
            limit=self.limit,
            on_bad_row=self.on_bad_row,
            encoding_errors=self.encoding_errors,
        )


def corpus_options() -> Callable[[Callable], Callable]:
    """--encoding-errors, --format, --text-column, --pair-column, --id-column, --words-column,
    --limit, --on-bad-row: the command takes them as ``columns: CorpusColumns``."""

    def column(name: str, help: str) -> inspect.Parameter:
        return group_option(name, None, str | None, help=help, panel=INPUT_PANEL)

    parameters = [
        group_parameter("encoding_errors", "strict", EncodingErrorsOption),
        group_option(
            "format",
            None,
            Format | None,
            "--format",
            panel=INPUT_PANEL,
            help="Input format [default: from the suffix]",
        ),
        column("text_column", "Column (field) holding the text"),
        column("pair_column", "Column holding a second segment: a pair"),
        column("id_column", "Column holding each row's id [default: the 0-based row]"),
        column("words_column", "List column of pre-split words (instead of a text)"),
        _optional_int("limit", "Only the first N texts: try before you run", INPUT_PANEL),
        group_option(
            "on_bad_row",
            "error",
            BadRow,
            panel=INPUT_PANEL,
            help="A null or non-text row: stop before writing (error), or skip and count it",
        ),
    ]

    return option_group(("columns",), parameters, lambda **given: {"columns": CorpusColumns(**given)})


@dataclass(frozen=True)
class LayoutOptions:
    """--block-size, --chunk-rows, --shard-chunks as given (None: the store's default)."""

    block_size: int | None = None
    chunk_rows: int | None = None
    shard_chunks: int | None = None

    def given(self) -> dict[str, int | None]:
        """Each option by its flag: what a back end without a store refuses when set."""
        return {
            "--block-size": self.block_size,
            "--chunk-rows": self.chunk_rows,
            "--shard-chunks": self.shard_chunks,
        }

    def layout(self) -> StoreLayout:
        from ..store._format import BLOCK_SIZE, CHUNK_ROWS, SHARD_CHUNKS, StoreLayout

        return StoreLayout(
            self.block_size or BLOCK_SIZE, self.chunk_rows or CHUNK_ROWS, self.shard_chunks or SHARD_CHUNKS
        )


def layout_options() -> Callable[[Callable], Callable]:
    """The store's layout options: the command takes them as ``layout: LayoutOptions``. Their bounds
    are written out, not read from store._format, so that the command line does not import the store
    at start-up; tests/test_hostile_inputs.py holds them equal to its constants."""
    parameters = [
        _optional_int(
            "block_size",
            "Store: texts sorted and committed together [default: 2048; at most 1,048,576]",
            LAYOUT_PANEL,
        ),
        _optional_int(
            "chunk_rows", "Store: rows per chunk [default: 128; at most 65,536 rows and 64 MiB]", LAYOUT_PANEL
        ),
        _optional_int(
            "shard_chunks",
            "Store: chunks per shard (one file, held in memory while written) [default: 64; at most "
            "16,384 chunks and 2 GiB]",
            LAYOUT_PANEL,
        ),
    ]
    return option_group(("layout",), parameters, lambda **given: {"layout": LayoutOptions(**given)})


@dataclass(frozen=True)
class RayOptions:
    """--ray (None: this process), --workers, --threads-per-worker, --shard-size as given."""

    mode: str | None = None
    workers: int | None = None
    threads_per_worker: int | None = None
    shard_size: int | None = None

    def sizes(self) -> tuple[int, int]:
        """``(workers, threads per worker)`` with their defaults filled in: 2 actors of 1 thread."""
        return self.workers or 2, self.threads_per_worker or 1

    def given(self) -> dict[str, int | None]:
        """The options that only Ray honours, by flag: a run in this process refuses them when set."""
        return {
            "--workers": self.workers,
            "--threads-per-worker": self.threads_per_worker,
            "--shard-size": self.shard_size,
        }


def ray_options(*, shard_size: bool = True) -> Callable[[Callable], Callable]:
    """--ray, --workers, --threads-per-worker and (``shard_size``: a sharded store's) --shard-size:
    the command takes them as ``ray: RayOptions``."""
    parameters = [
        group_option(
            "ray",
            None,
            str | None,
            "--ray",
            panel=RAY_PANEL,
            help="Run on Ray: local (start one here) or auto (join a cluster)",
        ),
        _optional_int("workers", "Ray actors, each with its model [default: 2]", RAY_PANEL),
        _optional_int("threads_per_worker", "torch threads (CPUs) per actor [default: 1]", RAY_PANEL),
    ]
    if shard_size:
        parameters.append(
            _optional_int(
                "shard_size",
                "Texts per shard [default: ~32 shards of 1024..4096, one per worker at least]",
                RAY_PANEL,
            )
        )

    def build(*, ray: str | None, **given: Any) -> dict[str, Any]:
        return {"ray": RayOptions(ray, **given)}

    return option_group(("ray",), parameters, build)


# a command's defaults for the groups' values, which the decorators replace on each run (as MODEL_SETTINGS)
DEFAULT_PLAN, ALL_COLUMNS = PlanOptions(), CorpusColumns()
DEFAULT_LAYOUT, NO_RAY = LayoutOptions(), RayOptions()
