"""``layerwise show`` (a tokens x layers table), ``layerwise verify`` (a store's integrity) and
``layerwise info`` (how an output was made)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from .._settings.settings import Settings
from ..errors import OptionError
from ._options import MODEL_SETTINGS, LayersOption, model_options
from ._shared import app, err, fail, setup_logging


@app.command()
@model_options()
def show(
    text: Annotated[str, typer.Argument(help="The text to show")],
    pair: Annotated[
        str | None, typer.Option("--pair", help="Second segment: [CLS] TEXT [SEP] PAIR [SEP]")
    ] = None,
    settings: Settings = MODEL_SETTINGS,  # the model options (@model_options)
    layers: LayersOption = "all",
) -> None:
    """Print a tokens x layers table: vector norm and cosine to the previous layer."""
    setup_logging(quiet=True)
    from .._analysis.show import layer_table
    from .._encoder import Encoder

    enc = Encoder.from_settings(settings)
    stack = enc.extract([text], text_pairs=[pair] if pair is not None else None, layers=layers)[0]
    from .._inputs.display import token_display

    table = layer_table(stack, model=enc.name, display=token_display(enc.tokenizer))
    console = Console()
    needed = Console(width=10_000).measure(table).maximum
    # a pipe or a narrow terminal would squeeze the token column away; print at the table's width
    Console(width=max(console.width, needed)).print(table)


@app.command()
def verify(
    store: Annotated[Path, typer.Argument(help="A store folder (*.lw) or an activation cache folder")],
) -> None:
    """Check a store (offsets, manifest, shards, every text's checksum) or an activation cache
    (record, contexts, shards, every context's token ids). Exit 1 if it is damaged."""
    if store.is_file() or not store.exists():
        what = "a file" if store.is_file() else "not there (no such file or folder)"
        raise fail(
            OptionError(
                f"{str(store)!r} is {what}: verify checks a store folder (*.lw, layerwise extract -o) or an "
                "activation cache folder (layerwise cache -o), every row against the checksum it was "
                "written with. A .npz, .parquet or .jsonl file carries no checksums: layerwise info shows "
                "how it was made"
            )
        )
    from .._cache.format import lost_its_record
    from .._cache.format import read_meta as read_cache_meta
    from ..store import verify_store

    if read_cache_meta(store) is not None or lost_its_record(store):
        from .._cache import verify_cache

        report = verify_cache(store)
    else:
        report = verify_store(store)
    (Console() if report.ok else err).print(str(report), highlight=False, markup=False, soft_wrap=True)
    if not report.ok:
        raise typer.Exit(code=1)


@app.command()
def info(
    path: Annotated[
        Path | None, typer.Argument(help="An output: .npz, .jsonl, .parquet or a store (*.lw)")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", "-m", help="Say how a model will run (its kind, path, streaming, taps), not an output"
        ),
    ] = None,
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="Read a config that comes with its own code")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the metadata as JSON")] = False,
) -> None:
    """Print how an output was made: layerwise's version, the model and its settings (dtype, max
    length, final norm, …), the plan (layers, pooling, fusion, dtype) and the source corpus. With
    --model: how that model will run, read from its config alone (no weights are loaded). With
    neither: this machine (CPU units, bfloat16 matrix units, the fastest CPU dtype, GPUs)."""
    if path is not None and model is not None:
        raise typer.BadParameter("pass an output to describe, or --model MODEL, not both")
    if path is None and model is None:
        from .._model.what_runs import describe_machine

        meta: dict = describe_machine()
    elif path is None:
        from .._model.families.media import modality_of_source
        from .._model.loading.source import resolve_model_source
        from .._model.what_runs import describe, describe_media

        source, name = resolve_model_source(model)
        if modality_of_source(source) != "text":  # an image model: its config read by transformers
            from transformers import AutoConfig

            meta = {"model": name, **describe_media(AutoConfig.from_pretrained(source))}
        else:
            meta = {"model": name, **describe(_config_of(source, name, trust_remote_code))}
    else:
        from .._files.meta import read_meta

        meta = read_meta(path)
    if as_json:
        import json

        typer.echo(json.dumps(meta, indent=1, ensure_ascii=False))
        return
    from rich.table import Table

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in meta.items():
        table.add_row(key, _shown(value))
    Console().print(table)


def _config_of(source: str, name: str, trust_remote_code: bool) -> object:
    """The config of ``source``, read and checked as a load reads it (source.py): a model that cannot
    run, or a config that cannot be read, is refused with the same message."""
    from .._model.loading.source import read_config

    return read_config(source, name, trust_remote_code=trust_remote_code)


def _shown(value: object) -> str:
    from rich.markup import escape

    if isinstance(value, list) and len(value) > 16:
        value = [*value[:8], "…", *value[-4:]]
    return escape(str(value))
