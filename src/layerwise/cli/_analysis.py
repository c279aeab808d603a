"""``layerwise pretrain``, ``analyze`` and ``plot``: thin commands over the library."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .._inputs.formats import EncodingErrors
from .._settings.settings import Settings
from ..errors import OptionError
from ._options import MODEL_SETTINGS, EncodingErrorsOption, LayersOption, model_options
from ._shared import app, check_output_file, err, setup_logging, use_available_cores


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
    setup_logging(quiet=True)
    from ..reference.pretrain import PretrainSettings
    from ..reference.pretrain import pretrain as run_pretraining

    use_available_cores()
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
    """Fail before any extraction when the projection or the figures cannot run here."""
    from .._analysis.plot import PROJECTIONS
    from .._settings.extras import require

    require("plot")

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
        from ..errors import MissingDependencyError

        raise MissingDependencyError(
            f"--projection {projection} needs {package}: pip install {package}"
        ) from None


def _read_single_texts(input: Path, encoding_errors: EncodingErrors, command: str) -> list[str]:
    """Texts of a .txt/.jsonl file; pairs are refused, as their second segment would be dropped."""
    from .._inputs.readers import read_input_file

    data = read_input_file(input, encoding_errors=encoding_errors)
    if data.text_pairs is not None and any(pair is not None for pair in data.text_pairs):
        raise OptionError(
            f"{str(input)!r} holds text pairs; `layerwise {command}` looks at single texts and would drop "
            "the second segment: pass a .txt file (one text per line) or a .jsonl without text_pair"
        )
    return data.texts


@app.command()
@model_options()
def analyze(
    input: Annotated[Path, typer.Argument(help="One text per line (.txt) or JSONL with 'text'")],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Folder for report.html, figures, stats.json")
    ],
    settings: Settings = MODEL_SETTINGS,  # the model options (@model_options)
    words: Annotated[
        str | None,
        typer.Option(help="Comma-separated words for self-similarity [default: the most frequent]"),
    ] = None,
    projection: ProjectionOption = "pca",
    max_texts: Annotated[int | None, typer.Option(min=2, help="Use the first N texts")] = None,
    encoding_errors: EncodingErrorsOption = "strict",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar")] = False,
) -> None:
    """Layer analysis of your texts as one self-contained HTML report (CKA, drift, anisotropy, ...)."""
    setup_logging(quiet)
    from .._analysis.report import write_report
    from .._encoder import Encoder

    _check_projection(projection)
    if output.exists() and not output.is_dir():
        raise OptionError(f"--output {str(output)!r} is a file; the report needs a folder")
    texts = _read_single_texts(input, encoding_errors, "analyze")[:max_texts]
    use_available_cores()
    enc = Encoder.from_settings(settings)
    chosen = [w.strip() for w in words.split(",") if w.strip()] if words else None
    stacks = enc.extract(texts, long_texts="window", progress=False if quiet else None)
    report = write_report(
        stacks,
        output,
        model=enc.name,
        max_length=enc.max_length,
        words=chosen,
        projection=projection,
        source=str(input),
        kind="decoder" if enc.is_decoder else "encoder",
        settings=enc.run_settings(),
    )
    err.print(f"report written to {report}", highlight=False)


@app.command()
@model_options()
def plot(
    input: Annotated[Path, typer.Argument(help="One text per line (.txt) or JSONL with 'text'")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Image file (.png, .svg, .pdf)")],
    words: Annotated[str, typer.Option(help="Comma-separated words to show, e.g. bank,crane")],
    projection: ProjectionOption = "pca",
    settings: Settings = MODEL_SETTINGS,  # the model options (@model_options)
    layers: LayersOption = "all",
    encoding_errors: EncodingErrorsOption = "strict",
) -> None:
    """One panel per layer: every occurrence of the given words, projected to 2-D and coloured by word."""
    setup_logging(quiet=True)
    from .._analysis.plot import plot_word_projections
    from .._encoder import Encoder

    _check_projection(projection)
    check_output_file(output, "--output", (".png", ".svg", ".pdf"))
    texts = _read_single_texts(input, encoding_errors, "plot")
    chosen = [w.strip() for w in words.split(",") if w.strip()]
    enc = Encoder.from_settings(settings)
    stacks = (s for _, s in enc.iter_extract(texts, layers=layers, long_texts="window", progress=False))
    path = plot_word_projections(stacks, chosen, output, projection=projection, model=enc.name)  # type: ignore[arg-type]
    err.print(f"figure written to {path}", highlight=False)
