"""``layerwise layers``: which layer to try first, without labels (the label-free metrics of
_analysis/label_free.py and the rule of _analysis/layer_choice.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from .._inputs.formats import EncodingErrors, Format
from .._settings.settings import Settings
from .._version import __version__
from ..errors import OptionError
from ._groups import InputFormatOption, TextColumnOption
from ._options import MODEL_SETTINGS, EncodingErrorsOption, model_options
from ._shared import app, check_output_file, err, fail, setup_logging, use_available_cores


@app.command()
@model_options()
def layers(
    input: Annotated[
        str,
        typer.Argument(
            help="Your texts: a corpus as extract reads it (.txt, .jsonl, .csv, .parquet, a glob, -); "
            "for an image model, image files (a folder or a glob)"
        ),
    ],
    text_column: TextColumnOption = None,
    format: InputFormatOption = None,
    max_texts: Annotated[int, typer.Option(min=2, help="Use the first N texts")] = 1000,
    views: Annotated[
        int,
        typer.Option(
            min=0,
            help="Augmented views per text for LiDAR, DiME and InfoNCE (each view is one more forward "
            "pass over the texts); 0: only the one-pass metrics",
        ),
    ] = 0,
    pool: Annotated[
        str,
        typer.Option(
            "--pool",
            "-p",
            help="How you will use the vectors, as extract's --pool says it: sentence:mean, sentence:last "
            "(decoders) or token (word:* too); the recommendation uses the rule measured for it",
        ),
    ] = "sentence:mean",
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the table as JSON")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the augmentations and permutations")] = 0,
    encoding_errors: EncodingErrorsOption = "strict",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar")] = False,
    settings: Settings = MODEL_SETTINGS,  # the model options (@model_options)
) -> None:
    """Which layer to try first, without labels: label-free metrics per hidden state (Skean et al.
    2025), and the layer the best-measured rule picks, with how reliable that rule has been."""
    setup_logging(quiet)
    from .._analysis.label_free import layer_metrics
    from .._analysis.layer_choice import recommend, use_of_pool
    from .._encoder import Encoder

    use = use_of_pool(pool)
    if views == 1:
        raise OptionError("--views 1 compares nothing: pass 0 (no view metrics) or 2 or more")
    if json_path is not None:
        check_output_file(json_path, "--json")  # before the work, not after it
    media = _first_media(input, settings, max_texts, views)
    texts = media or _first_texts(input, format, text_column, max_texts, encoding_errors)
    use_available_cores()
    err.print(f"loading {settings.model or 'the default model'} …", highlight=False)
    enc = Encoder.from_settings(settings)
    names = "all" if views >= 2 else "one-pass"
    metrics = layer_metrics(
        enc, texts, metrics=names, views=max(views, 2), seed=seed, progress=False if quiet else None
    )
    choice = recommend(metrics, kind="decoder" if enc.is_decoder else "encoder", use=use)
    _print_table(metrics, choice.layer, "texts" if not media else _PLURAL[enc.modality])
    _say_choice(choice, enc.modality if media else None)
    if json_path is not None:
        # how the table was made, as every layerwise output says
        made = {
            "layerwise": __version__,
            "settings": enc.run_settings(),
            "source": input,
            "views": views,
            "seed": seed,
            "pool": pool,
        }
        table = {**metrics.as_dict(), "model": enc.name, "made": made, "recommendation": choice.as_dict()}
        try:  # atomically: a failed write leaves no half-written file
            tmp = json_path.with_name(f".{json_path.name}.partial")
            tmp.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, json_path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            failed = OptionError(f"--json {str(json_path)!r} cannot be written: {exc.strerror or exc}")
            raise fail(failed) from None


_PLURAL = {"image": "images", "audio": "clips"}


def _say_choice(choice, modality: str | None) -> None:
    typer.echo(str(choice))
    if modality is not None:
        typer.echo(
            f"(The rule was measured on text encoders' layers; for an {modality} model take its pick as "
            "a first guess, and the table as what it measured.)"
        )
    if len(choice.candidates) > 1:
        typer.echo("Candidates, each with the rules that pick it and their regret on the benchmark:")
        typer.echo(choice.candidates_text())


def _first_media(source: str, settings: Settings, limit: int, views: int) -> list[str]:
    """The first ``limit`` files ``source`` names (a folder, a glob, a file), where the model reads
    images or sound; else none (its texts are read)."""
    from .._inputs.media_sources import files_of, names_files_of
    from .._model.loading.source import modality_of

    modality = modality_of(settings)
    if modality == "text" or not names_files_of(source, modality):
        return []
    if views:
        raise OptionError(
            f"--views {views}: LiDAR, DiME and InfoNCE compare augmented views of texts (words dropped); "
            f"for an {modality} model pass --views 0 (the one-pass metrics)"
        )
    files = files_of([source], modality)[:limit]
    if len(files) < 2:
        raise OptionError(f"{source!r} holds {len(files)} file(s); the metrics need 2 or more")
    return files


def _first_texts(
    source: str, format: Format | None, text_column: str | None, limit: int, encoding_errors: EncodingErrors
) -> list[str]:
    """The first ``limit`` non-empty texts of a corpus; pairs are refused (their second segment
    would be dropped)."""
    from .._inputs.corpus import Corpus

    corpus = Corpus(source, format=format, text_column=text_column, encoding_errors=encoding_errors)
    texts: list[str] = []
    for block in corpus.blocks(1024):
        if block.text_pairs is not None and any(pair is not None for pair in block.text_pairs):
            raise OptionError(
                f"{source!r} holds text pairs; `layerwise layers` measures single texts and would drop "
                "the second segment: pass single texts (a .txt file, or a table without a pair column)"
            )
        texts += [text for text in block.texts if text.strip()]
        if len(texts) >= limit:
            break
    if len(texts) < 2:
        raise OptionError(f"{source!r} holds {len(texts)} non-empty text(s); the metrics need 2 or more")
    return texts[:limit]


def _print_table(metrics, chosen: int, noun: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from .._analysis.label_free import HIGHER_IS_BETTER

    table = Table(title=f"label-free metrics over {metrics.n_texts} {noun} (* marks each metric's pick)")
    table.add_column("hidden state", justify="right")
    names = list(metrics.values)
    for name in names:
        header = name.replace("_", "\n") + ("\n(higher)" if HIGHER_IS_BETTER[name] else "\n(lower)")
        table.add_column(header, justify="right")
    best = metrics.picks()
    for k, layer in enumerate(metrics.layers):
        cells = [f"{metrics.values[name][k]:.4g}" + (" *" if best[name] == layer else "  ") for name in names]
        table.add_row(f"{layer}" + (" <- try first" if layer == chosen else ""), *cells)
    Console(width=max(100, 11 * (len(names) + 1) + 16)).print(table)
