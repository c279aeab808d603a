"""``layerwise probe conllu|conll|tsv|pairs``: layer-wise probes from the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from .._features.names import SubwordPool
from .._settings.settings import Settings
from ._options import MODEL_SETTINGS, model_options
from ._shared import ReportingTyper, app, check_output_file, err, setup_logging

probe_app = ReportingTyper(
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
SubwordOption = Annotated[SubwordPool, typer.Option(help="How a word's subword vectors become one")]


def _controls(value: str) -> tuple[str, ...]:
    return () if value.strip() in ("", "none") else tuple(v.strip() for v in value.split(","))


def _run_probe(
    task: str, json_path: Path | None, plot_path: Path | None, settings: Settings, **options
) -> None:
    setup_logging(quiet=False)
    from .._encoder import Encoder
    from .._probing import probe
    from .._settings.extras import require

    # a probe runs for minutes: refuse a missing extra, an unwritable --json/--plot before it starts
    require("probe")
    if json_path is not None:
        check_output_file(json_path, "--json")
    if plot_path is not None:
        require("plot", "--plot")
        check_output_file(plot_path, "--plot", (".png", ".svg", ".pdf"))
    # the probed model, and the random-model control built as it is (settings whole)
    result = probe(task, encoder=Encoder.from_settings(settings), **options)  # type: ignore[arg-type]
    Console().print(result.table())
    if json_path is not None:
        result.to_json(json_path)
        err.print(f"numbers written to {json_path}", highlight=False)
    if plot_path is not None:
        result.plot(plot_path)
        err.print(f"curve written to {plot_path}", highlight=False)


def _word_task(task: str, doc: str, train_help: str, dev_help: str, column_help: str, column: str) -> None:
    """Register ``probe TASK`` for word-level tags read from files (conllu, conll): one command body,
    with the task's own help and default column."""

    def command(
        train,
        dev,
        column=column,
        max_train=None,
        max_dev=None,
        subword="first",
        controls="random_model,control_task",
        seed=0,
        settings=MODEL_SETTINGS,
        json_path=None,
        plot_path=None,
    ) -> None:
        _run_probe(
            task,
            json_path,
            plot_path,
            settings,
            train=train,
            dev=dev,
            column=column,
            max_train=max_train,
            max_dev=max_dev,
            subword=subword,
            controls=_controls(controls),
            seed=seed,
        )

    command.__annotations__ = {
        "train": Annotated[Path, typer.Option(help=train_help)],
        "dev": Annotated[Path, typer.Option(help=dev_help)],
        "column": Annotated[str, typer.Option(help=column_help)],
        "max_train": Annotated[int | None, typer.Option(min=1, help="Use the first N training sentences")],
        "max_dev": Annotated[int | None, typer.Option(min=1, help="Use the first N dev sentences")],
        "subword": SubwordOption,
        "controls": ControlsOption,
        "seed": SeedOption,
        "settings": Settings,  # the model options (@model_options)
        "json_path": JsonOption,
        "plot_path": PlotOption,
        "return": None,
    }
    command.__name__ = command.__qualname__ = f"probe_{task}"
    command.__doc__ = doc
    probe_app.command(task)(model_options()(command))


_word_task(
    "conllu",
    "Word-level tags from CoNLL-U (Universal Dependencies): accuracy per layer and fusion.",
    "Training CoNLL-U file",
    "Dev CoNLL-U file",
    "upos | xpos | deprel | feats | lemma",
    "upos",
)
_word_task(
    "conll",
    "CoNLL-2003 columns; NER is scored by entity-level F1 with BIO decoding (conlleval rules).",
    "CoNLL-2003 style training file (word POS chunk NER)",
    "Dev file, e.g. eng.testa",
    "ner (entity F1) | pos | chunk",
    "ner",
)


@probe_app.command("tsv")
@model_options()
def probe_tsv(
    train: Annotated[Path, typer.Option(help="TSV/CSV with a header row")],
    dev: Annotated[Path, typer.Option(help="TSV/CSV with the same columns")],
    text_column: Annotated[str, typer.Option(help="Column with the sentence")] = "sentence",
    label_column: Annotated[str, typer.Option(help="Column with the class label")] = "label",
    max_train: Annotated[int | None, typer.Option(min=1, help="Use the first N training rows")] = None,
    controls: ControlsOption = "random_model",
    seed: SeedOption = 0,
    settings: Settings = MODEL_SETTINGS,  # the model options (@model_options)
    json_path: JsonOption = None,
    plot_path: PlotOption = None,
) -> None:
    """Sentence classification from mean-pooled layers: accuracy per layer and fusion."""
    _run_probe(
        "tsv",
        json_path,
        plot_path,
        settings,
        train=train,
        dev=dev,
        text_column=text_column,
        label_column=label_column,
        max_train=max_train,
        controls=_controls(controls),
        seed=seed,
    )


@probe_app.command("pairs")
@model_options()
def probe_pairs(
    data: Annotated[Path, typer.Option(help="TSV/CSV with two sentence columns and a similarity score")],
    first_column: Annotated[str, typer.Option(help="First sentence column")] = "sentence1",
    second_column: Annotated[str, typer.Option(help="Second sentence column")] = "sentence2",
    score_column: Annotated[str, typer.Option(help="Gold similarity column")] = "score",
    controls: ControlsOption = "random_model",
    settings: Settings = MODEL_SETTINGS,  # the model options (@model_options)
    json_path: JsonOption = None,
    plot_path: PlotOption = None,
) -> None:
    """Sentence-pair similarity: Spearman of cosine(mean-pooled layer) with the gold scores."""
    _run_probe(
        "pairs",
        json_path,
        plot_path,
        settings,
        data=data,
        first_column=first_column,
        second_column=second_column,
        score_column=score_column,
        controls=_controls(controls),
        scalar_mix=False,
    )
