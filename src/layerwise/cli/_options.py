"""The options commands share: the option types and choices, option groups (``option_group``) and
the model options made from the fields of Settings (``@model_options``). The app and the helpers
are in _shared.py.

Importing this module must stay cheap (``layerwise --help`` never imports torch): the library is
imported inside the commands.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer

from .._inputs.formats import EncodingErrors
from .._settings.settings import FinalNormName, Settings

# The choices are the library's own Literal types (Typer offers their values): each list is
# written once, where the library checks it.
EncodingErrorsOption = Annotated[
    EncodingErrors, typer.Option(help="strict: stop at invalid UTF-8; replace: use U+FFFD")
]
LayersOption = Annotated[
    str, typer.Option("--layers", "-l", help="all | -1 | 0,4,-1 | 0:4 (end excluded) | last4; 0 = embeddings")
]


# The options of how a model is loaded and run: made from the fields of Settings (their type,
# default, help and spellings: _settings.setting), taken by every command that loads a model
# (@model_options), which receives them as one Settings.
_MODEL = "Model"
_KEYWORD = inspect.Parameter.KEYWORD_ONLY


_MANY_MODELS = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        "-m",
        help="A model (repeat for several) [default: packaged all-MiniLM-L6-v2]",
        rich_help_panel=_MODEL,
    ),
]


def group_parameter(name: str, default: object, annotation: object) -> inspect.Parameter:
    """One option of a group (``option_group``): the keyword ``name``, its default and its Typer
    annotation."""
    return inspect.Parameter(name, _KEYWORD, default=default, annotation=annotation)


def group_option(
    name: str, default: object, kind: object, *flags: str, panel: str, **typer_options: Any
) -> inspect.Parameter:
    """One option of a group, of type ``kind``, listed under ``panel`` in the help: ``flags`` and
    ``typer_options`` as ``typer.Option`` takes them."""
    option = typer.Option(*flags, rich_help_panel=panel, **typer_options)
    return group_parameter(name, default, Annotated[kind, option])


def _setting_option(
    field: dataclasses.Field, kind: Any, final_norm: FinalNormName | None
) -> inspect.Parameter:
    """The option of one Settings field: its type (or its command-line spelling's), default, help
    and flags from the field (``_settings.setting``); ``final_norm``: the command's default of it."""
    meta = field.metadata
    default = field.default
    if meta.get("cli"):
        kind, default = meta["cli"][0], final_norm  # the command's own default, in its spelling
    help_text = meta["help"].format(final_norm or "last") if field.name == "final_norm" else meta["help"]
    limits = {"min": 1} if meta.get("whole") else {}
    flags = meta.get("flags", ())
    return group_option(field.name, default, kind, *flags, panel=_MODEL, help=help_text, **limits)


def _model_parameters(final_norm: FinalNormName | None, many: bool = False) -> list[inspect.Parameter]:
    kinds = typing.get_type_hints(Settings)
    parameters = [_setting_option(f, kinds[f.name], final_norm) for f in dataclasses.fields(Settings)]
    # --streams: the earlier name of --concurrent-forwards, for one release (Settings warns and sets it)
    deprecated = "Deprecated: use --concurrent-forwards"
    parameters.append(
        group_option("streams", None, int | None, panel=_MODEL, help=deprecated, hidden=True, min=1)
    )
    if many:  # the server's models: --model repeated
        parameters[0] = group_parameter("model", None, _MANY_MODELS)
    return parameters


def model_option_names() -> tuple[str, ...]:
    """The keywords of the model options: the fields of Settings."""
    return tuple(f.name for f in dataclasses.fields(Settings))


# a command's ``settings: Settings = MODEL_SETTINGS``: the value @model_options replaces on each run
MODEL_SETTINGS = Settings()


def _evaluated(parameter: inspect.Parameter, command: Callable) -> inspect.Parameter:
    """``parameter`` with its annotation evaluated where it is a string (``from __future__ import
    annotations``), in the namespace of the function that wrote it."""
    if not isinstance(parameter.annotation, str):
        return parameter
    written = inspect.unwrap(command)
    return parameter.replace(annotation=eval(parameter.annotation, written.__globals__))


def option_group(
    provides: tuple[str, ...], parameters: list[inspect.Parameter], build: Callable[..., dict[str, Any]]
) -> Callable[[Callable], Callable]:
    """Give a command a group of options that it takes as values of its own: the command declares the
    keywords ``provides``; Typer sees ``parameters`` instead, and each run passes
    ``build(**their values)`` (a dict over ``provides``). A bad value fails as any option does."""
    names = tuple(p.name for p in parameters)

    def decorate(command: Callable) -> Callable:
        own = inspect.signature(command)
        # Typer needs the kept options' types; the provided values' are not evaluated, so a command may
        # name one that is imported for the type checker alone (a ServeSettings, whose module needs FastAPI)
        kept = [
            _evaluated(p, command).replace(kind=_KEYWORD)
            for p in own.parameters.values()
            if p.name not in provides
        ]
        clash = {p.name for p in kept} & set(names)
        assert not clash, f"{command.__name__} declares a group's options itself: {clash}"
        every = [*kept, *parameters]

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            chosen = {name: values.pop(name) for name in names}
            values.update(build(**chosen))  # a bad value: a LayerwiseError, reported as the command's
            return command(**values)

        run.__signature__ = own.replace(parameters=every)  # type: ignore[attr-defined]  # what Typer reads
        run.__annotations__ = {p.name: p.annotation for p in every}
        return run

    return decorate


def model_options(
    final_norm: FinalNormName | None = None, *, many: bool = False
) -> Callable[[Callable], Callable]:
    """Give a command the model options, one per field of Settings (--model, --device,
    --model-dtype, …: _model_parameters); it takes them as one ``settings: Settings`` keyword.
    ``final_norm``: the command's default of --final-norm (None: last; the activation cache says
    none, SAELens' raw residual stream).
    ``many``: --model may be repeated (the server's models): the command takes them as ``models``
    (None: not given), and ``settings`` without a model."""

    def build(**chosen: Any) -> dict[str, Any]:
        if not many:
            return {"settings": settings_from_options(**chosen)}
        models, chosen["model"] = chosen["model"], None
        return {"settings": settings_from_options(**chosen), "models": models}

    provides = ("settings", "models") if many else ("settings",)
    return option_group(provides, _model_parameters(final_norm, many), build)


def settings_from_options(**values: Any) -> Settings:
    """The Settings of the model options' values, each field's command-line spelling turned into its
    value (checked: a bad value names itself)."""
    for f in dataclasses.fields(Settings):
        if f.metadata.get("cli"):
            values[f.name] = f.metadata["cli"][1](values[f.name])
    return Settings(**values)
