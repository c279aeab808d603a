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
from .errors import InputError, LayerwiseError, OptionError

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
    replace = "replace"


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


def _fail(exc: Exception) -> typer.Exit:
    err.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(code=2)


def _setup_logging(quiet: bool) -> None:
    logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.ERROR if quiet else logging.INFO)
    logging.getLogger("layerwise").setLevel(logging.ERROR if quiet else logging.INFO)


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
        typer.Option(min=1, help="Most padded tokens per forward pass [default: 2048 on CPU, 32768 on GPU]"),
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
    long_texts: Annotated[
        LongTextsChoice, typer.Option(help="Inputs over the model maximum: truncate, or sliding windows")
    ] = LongTextsChoice.truncate,
    stride: Annotated[
        int | None, typer.Option(min=1, help="Window step in tokens [default: half a window]")
    ] = None,
    device: DeviceOption = "auto",
    encoding_errors: Annotated[
        EncodingErrorsChoice, typer.Option(help="strict: stop at invalid UTF-8; replace: use U+FFFD")
    ] = EncodingErrorsChoice.strict,
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
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summary")] = False,
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
            dtype=(dtype or default_dtype).value,
        )  # fmt: skip
        data = read_input_file(input, encoding_errors=encoding_errors.value)
        if not len(data):
            raise InputError(f"{input} holds no texts")
        started = time.perf_counter()
        enc = Encoder(model, device=device, model_dtype=model_dtype.value, max_length=max_length,
                      batch_size=batch_size, max_tokens=max_tokens)  # fmt: skip
        _use_available_cores()
        common = {
            "text_pairs": data.text_pairs, "long_texts": long_texts.value, "stride": stride,
            "method": method.value, "source": str(input), "progress": False if quiet else None,
        }  # fmt: skip
        if to_store:
            from .store import extract_to_store

            layout = {"block_size": block_size, "chunk_rows": chunk_rows, "shard_chunks": shard_chunks}
            stored = extract_to_store(enc, data.texts, output, plan, overwrite=overwrite, **layout, **common)
            if not quiet:
                _report_store(stored, enc.name)
            return
        summary = extract_to_file(enc, data.texts, output, plan, **common)  # type: ignore[arg-type]
    except LayerwiseError as exc:
        raise _fail(exc) from None
    if not quiet:
        _report_file(summary, data.texts, plan.hidden_states(enc.n_hidden_states), enc, output, started)


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
def pretrain(
    corpus: Annotated[Path, typer.Argument(help="One sentence per line, a blank line between documents")],
    output: Annotated[Path, typer.Option("--output", "-o", help="New folder for the model and tokenizer")],
    layers: Annotated[int, typer.Option(min=1, help="Encoder layers")] = 4,
    hidden: Annotated[int, typer.Option(min=8, help="Hidden size")] = 256,
    heads: Annotated[int, typer.Option(min=1, help="Attention heads (must divide --hidden)")] = 4,
    steps: Annotated[int, typer.Option(min=1, help="Training steps")] = 2000,
    vocab_size: Annotated[int, typer.Option(min=100, help="WordPiece vocabulary size")] = 8000,
    max_length: Annotated[int, typer.Option(min=16, help="Tokens per example")] = 128,
    batch_size: Annotated[int, typer.Option(min=1, help="Examples per step")] = 32,
    learning_rate: Annotated[float, typer.Option(help="Peak AdamW learning rate")] = 5e-4,
    seed: Annotated[int, typer.Option(help="Seed of data, masking and initialisation")] = 0,
    eval_fraction: Annotated[
        float, typer.Option(min=0.01, max=0.5, help="Share of documents held out for evaluation")
    ] = 0.05,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar")] = False,
) -> None:
    """Pretrain a small BERT from scratch (WordPiece + masked LM + next-sentence prediction) on CPU."""
    _setup_logging(quiet=True)
    try:
        from .reference.pretrain import PretrainSettings
        from .reference.pretrain import pretrain as run_pretraining

        _use_available_cores()
        settings = PretrainSettings(
            layers=layers,
            hidden=hidden,
            heads=heads,
            steps=steps,
            vocab_size=vocab_size,
            max_length=max_length,
            batch_size=batch_size,
            learning_rate=learning_rate,
            seed=seed,
            eval_fraction=eval_fraction,
        )
        result = run_pretraining(corpus, output, settings, progress=False if quiet else None)
    except LayerwiseError as exc:
        raise _fail(exc) from None
    held_out = result["held_out"]
    err.print(
        f"saved to {output} after {steps} steps in {result['seconds']:.0f} s. Held out: MLM accuracy "
        f"{held_out['mlm_accuracy']:.1%} (most frequent token: {held_out['mlm_baseline']:.1%}), "
        f"NSP accuracy {held_out['nsp_accuracy']:.1%}. Use it: layerwise extract texts.txt --model {output}",
        highlight=False,
        soft_wrap=True,
    )


ProjectionOption = Annotated[str, typer.Option("--projection", help="pca | tsne | umap (needs umap-learn)")]


def _check_projection(projection: str) -> None:
    """Fail before any extraction when the projection cannot run here."""
    from .plot import PROJECTIONS

    if projection not in PROJECTIONS:
        raise OptionError(f"--projection {projection!r} is not valid; choose one of {', '.join(PROJECTIONS)}")
    needs = {
        "tsne": ("sklearn", "scikit-learn"),
        "pca": ("sklearn", "scikit-learn"),
        "umap": ("umap", "umap-learn"),
    }
    module, package = needs[projection]
    try:
        __import__(module)
    except ImportError:
        from .errors import MissingDependencyError

        raise MissingDependencyError(
            f"--projection {projection} needs {package}: pip install {package}"
        ) from None


@app.command()
def analyze(
    input: Annotated[Path, typer.Argument(help="One text per line (.txt) or JSONL with 'text'")],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Folder for report.html, figures, stats.json")
    ],
    model: ModelOption = None,
    words: Annotated[
        str | None,
        typer.Option(help="Comma-separated words for self-similarity [default: the most frequent]"),
    ] = None,
    projection: ProjectionOption = "pca",
    max_texts: Annotated[int | None, typer.Option(min=2, help="Use the first N texts")] = None,
    device: DeviceOption = "auto",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar")] = False,
) -> None:
    """Layer analysis of your texts as one self-contained HTML report (CKA, drift, anisotropy, ...)."""
    _setup_logging(quiet)
    try:
        from .encoder import Encoder
        from .readers import read_input_file
        from .report import write_report

        _check_projection(projection)
        if output.exists() and not output.is_dir():
            raise OptionError(f"--output {str(output)!r} is a file; the report needs a folder")
        data = read_input_file(input)
        texts = data.texts[:max_texts]
        _use_available_cores()
        enc = Encoder(model, device=device)
        chosen = [w.strip() for w in words.split(",") if w.strip()] if words else None
        stacks = enc.extract(texts, long_texts="window", progress=False if quiet else None)
        report = write_report(stacks, output, model=enc.name, max_length=enc.max_length, words=chosen,
                              projection=projection, source=str(input))  # fmt: skip
    except LayerwiseError as exc:
        raise _fail(exc) from None
    err.print(f"report written to {report}", highlight=False)


@app.command()
def plot(
    input: Annotated[Path, typer.Argument(help="One text per line (.txt) or JSONL with 'text'")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Image file (.png, .svg, .pdf)")],
    words: Annotated[str, typer.Option(help="Comma-separated words to show, e.g. bank,crane")],
    projection: ProjectionOption = "pca",
    model: ModelOption = None,
    layers: LayersOption = "all",
    device: DeviceOption = "auto",
) -> None:
    """One panel per layer: every occurrence of the given words, projected to 2-D and coloured by word."""
    _setup_logging(quiet=True)
    try:
        from .encoder import Encoder
        from .plot import plot_word_projections
        from .readers import read_input_file

        _check_projection(projection)
        if output.suffix.lower() not in (".png", ".svg", ".pdf"):
            raise OptionError(f"--output {str(output)!r}: use a .png, .svg or .pdf file")
        if not output.parent.is_dir() or not os.access(output.parent, os.W_OK):
            raise OptionError(f"--output {str(output)!r}: the folder does not exist or is not writable")
        data = read_input_file(input)
        chosen = [w.strip() for w in words.split(",") if w.strip()]
        enc = Encoder(model, device=device)
        stacks = (
            s for _, s in enc.iter_extract(data.texts, layers=layers, long_texts="window", progress=False)
        )
        path = plot_word_projections(stacks, chosen, output, projection=projection, model=enc.name)  # type: ignore[arg-type]
    except LayerwiseError as exc:
        raise _fail(exc) from None
    err.print(f"figure written to {path}", highlight=False)


probe_app = typer.Typer(
    help="Layer-wise probes: one row per layer and per fusion, with controls. Which layer, which fusion?",
    no_args_is_help=True,
)
app.add_typer(probe_app, name="probe")

JsonOption = Annotated[Path | None, typer.Option("--json", help="Write the numbers to this JSON file")]
PlotOption = Annotated[
    Path | None, typer.Option("--plot", help="Write the per-layer curve (.png, .svg, .pdf)")
]
ControlsOption = Annotated[
    str, typer.Option("--controls", help="random_model,control_task | random_model | control_task | none")
]
SeedOption = Annotated[int, typer.Option(help="Seed of probes, controls and the random model")]


def _controls(value: str) -> tuple[str, ...]:
    return () if value.strip() in ("", "none") else tuple(v.strip() for v in value.split(","))


def _run_probe(
    task: str, json_path: Path | None, plot_path: Path | None, model: str | None, **options
) -> None:
    _setup_logging(quiet=False)
    try:
        from .probing import probe

        result = probe(task, model=model, **options)  # type: ignore[arg-type]
        Console().print(result.table())
        if json_path is not None:
            result.to_json(json_path)
            err.print(f"numbers written to {json_path}", highlight=False)
        if plot_path is not None:
            result.plot(plot_path)
            err.print(f"curve written to {plot_path}", highlight=False)
    except LayerwiseError as exc:
        raise _fail(exc) from None


@probe_app.command("conllu")
def probe_conllu(
    train: Annotated[Path, typer.Option(help="Training CoNLL-U file")],
    dev: Annotated[Path, typer.Option(help="Dev CoNLL-U file")],
    column: Annotated[str, typer.Option(help="upos | xpos | deprel | feats | lemma")] = "upos",
    max_train: Annotated[int | None, typer.Option(min=1, help="Use the first N training sentences")] = None,
    max_dev: Annotated[int | None, typer.Option(min=1, help="Use the first N dev sentences")] = None,
    subword: Annotated[str, typer.Option(help="first | last | mean | first_last | max")] = "first",
    controls: ControlsOption = "random_model,control_task",
    seed: SeedOption = 0,
    model: ModelOption = None,
    json_path: JsonOption = None,
    plot_path: PlotOption = None,
) -> None:
    """Word-level tags from CoNLL-U (Universal Dependencies): accuracy per layer and fusion."""
    _run_probe("conllu", json_path, plot_path, model, train=train, dev=dev, column=column,
               max_train=max_train, max_dev=max_dev, subword=subword, controls=_controls(controls),
               seed=seed)  # fmt: skip


@probe_app.command("conll")
def probe_conll(
    train: Annotated[Path, typer.Option(help="CoNLL-2003 style training file (word POS chunk NER)")],
    dev: Annotated[Path, typer.Option(help="Dev file, e.g. eng.testa")],
    column: Annotated[str, typer.Option(help="ner (entity F1) | pos | chunk")] = "ner",
    max_train: Annotated[int | None, typer.Option(min=1, help="Use the first N training sentences")] = None,
    max_dev: Annotated[int | None, typer.Option(min=1, help="Use the first N dev sentences")] = None,
    subword: Annotated[str, typer.Option(help="first | last | mean | first_last | max")] = "first",
    controls: ControlsOption = "random_model,control_task",
    seed: SeedOption = 0,
    model: ModelOption = None,
    json_path: JsonOption = None,
    plot_path: PlotOption = None,
) -> None:
    """CoNLL-2003 columns; NER is scored by entity-level F1 with BIO decoding (conlleval rules)."""
    _run_probe("conll", json_path, plot_path, model, train=train, dev=dev, column=column, max_train=max_train,
               max_dev=max_dev, subword=subword, controls=_controls(controls), seed=seed)  # fmt: skip


@probe_app.command("tsv")
def probe_tsv(
    train: Annotated[Path, typer.Option(help="TSV/CSV with a header row")],
    dev: Annotated[Path, typer.Option(help="TSV/CSV with the same columns")],
    text_column: Annotated[str, typer.Option(help="Column with the sentence")] = "sentence",
    label_column: Annotated[str, typer.Option(help="Column with the class label")] = "label",
    max_train: Annotated[int | None, typer.Option(min=1, help="Use the first N training rows")] = None,
    controls: ControlsOption = "random_model",
    seed: SeedOption = 0,
    model: ModelOption = None,
    json_path: JsonOption = None,
    plot_path: PlotOption = None,
) -> None:
    """Sentence classification from mean-pooled layers: accuracy per layer and fusion."""
    _run_probe("tsv", json_path, plot_path, model, train=train, dev=dev, text_column=text_column,
               label_column=label_column, max_train=max_train, controls=_controls(controls),
               seed=seed)  # fmt: skip


@probe_app.command("pairs")
def probe_pairs(
    data: Annotated[Path, typer.Option(help="TSV/CSV with two sentence columns and a similarity score")],
    first_column: Annotated[str, typer.Option(help="First sentence column")] = "sentence1",
    second_column: Annotated[str, typer.Option(help="Second sentence column")] = "sentence2",
    score_column: Annotated[str, typer.Option(help="Gold similarity column")] = "score",
    controls: ControlsOption = "random_model",
    model: ModelOption = None,
    json_path: JsonOption = None,
    plot_path: PlotOption = None,
) -> None:
    """Sentence-pair similarity: Spearman of cosine(mean-pooled layer) with the gold scores."""
    _run_probe("pairs", json_path, plot_path, model, data=data, first_column=first_column,
               second_column=second_column, score_column=score_column, controls=_controls(controls),
               scalar_mix=False)  # fmt: skip


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


if __name__ == "__main__":
    main()
