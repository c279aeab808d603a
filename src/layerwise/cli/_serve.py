"""``layerwise serve``: load the models once, then serve them over HTTP (see layerwise.serve)."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from .._settings.serve import ServeSettings, serve_options
from .._settings.settings import Settings
from ..errors import OptionError
from ._options import MODEL_SETTINGS, group_option, model_options, option_group
from ._shared import app, err, setup_logging, use_available_cores

# The Encoders of this process serve tokenisation, metadata and the explorer; the batcher's runs go
# to the model process (serve/model_process.py) on a CPU, or to one stream of their own on a GPU.
SERVE_FORWARDS = 1


def _check_host(host: str) -> None:
    """An empty or blank --host would bind every interface under a URL that names none."""
    if not host.strip() or host != host.strip():
        raise OptionError(
            f"--host {host!r} is not an address: use 127.0.0.1 (this machine only, the default), or an "
            "interface's address, or 0.0.0.0 (every interface; with an API key)"
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


StoreOption = Annotated[
    Path | None,
    typer.Option(
        help="A token-level store (of one served model) for the explorer's neighbours, projections and "
        "CKA [default: a built-in sample of UD English EWT]"
    ),
]


LIMITS_PANEL = "Server limits"


def server_options() -> Callable[[Callable], Callable]:
    """The server's own options (its API key, size limits, queue, timeouts and its long-text
    default), one per ServeSettings field made with ``limit`` (_settings/serve.py): the command
    takes them as ``served: ServeSettings``, checked as it checks them."""
    options = serve_options()
    parameters = [
        group_option(o.name, o.default, o.kind, panel=LIMITS_PANEL, help=o.help, **o.bounds) for o in options
    ]

    def build(**values: Any) -> dict[str, Any]:
        _require_uvicorn("serve")
        served = ServeSettings(**{o.field: o.to_value(values[o.name]) for o in options})
        return {"served": served}

    return option_group(("served",), parameters, build)


# ``served: ServeSettings = SERVED``: the value @server_options replaces on each run (a ServeSettings
# is not made here: importing the service needs FastAPI, and ``layerwise --help`` must not)
SERVED: Any = None


@app.command()
@model_options(many=True)
@server_options()
def serve(
    host: Annotated[
        str, typer.Option(help="Address to bind; anything but loopback is reachable by others")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free port)")] = 8000,
    model_process: Annotated[
        bool | None,
        typer.Option(
            "--model-process/--in-process",
            help="Run the models in a process of their own, apart from the HTTP event loop's GIL "
            "[default: on a CPU]",
        ),
    ] = None,
    store: StoreOption = None,
    served: ServeSettings = SERVED,  # the server's limits (@server_options)
    models: list[str] | None = None,  # --model, repeated (@model_options)
    settings: Settings = MODEL_SETTINGS,  # the model options (@model_options)
) -> None:
    """Serve every layer over HTTP: OpenAI-compatible /v1/embeddings, /v1/layers, /metrics, and the
    layer explorer page at /."""
    setup_logging(quiet=False)
    from ..serve import create_app

    _check_host(host)
    if not _is_loopback(host) and served.api_key is None:
        err.print(
            f"[yellow]warning:[/] binding {host}, which other machines can reach, without an API key; "
            "pass --api-key-file or set LAYERWISE_API_KEY",
            highlight=False,
        )
    encoders = _load_encoders(models, settings.replace(concurrent_forwards=SERVE_FORWARDS))
    # model runs at once (this process's Encoders run one each); a GPU runs its kernels without
    # the GIL's help: one process there
    on_cpu = all(encoder.device.type == "cpu" for encoder in encoders.values())
    chosen = on_cpu if model_process is None else model_process
    served = dataclasses.replace(
        served, concurrent_forwards=settings.concurrent_forwards, model_process=chosen
    )
    application = create_app(encoders, served, reference_store=store)
    err.print(
        f"serving {', '.join(encoders)} on http://{host}:{port} (explorer: /, docs: /docs, OpenAI "
        f"base_url: http://{host}:{port}/v1){'' if served.api_key else '; no API key'}",
        highlight=False,
        soft_wrap=True,
    )
    _run_server(application, host, port, served)


def _require_uvicorn(command: str) -> None:
    from .._settings.extras import require

    require("serve", command)


def _load_encoders(model: list[str] | None, base) -> dict:
    """Each --model loaded once (default: the packaged model), by its resolved name, with the
    command's settings (``base``: a Settings without a model)."""
    # Before torch loads OpenMP: its idle threads sleep instead of spinning between ops, in this
    # process (the event loop needs a core between model runs), not in the model process. A user's
    # own setting wins; offline extraction keeps OpenMP's default, where nothing else runs.
    from ..serve._model_process import passive_openmp_here

    if base.streaming:  # before anything loads (create_app says the same to the library's callers)
        from ..serve._app import NOT_INTERACTIVE

        raise OptionError(NOT_INTERACTIVE.format("the model"))
    passive_openmp_here()
    from .._encoder import Encoder
    from .._model.loading.source import reads_media

    use_available_cores()
    encoders = {}
    for name in list(model) if model else [None]:
        # an image or a speech model runs in this process, one request at a time (serve/_media.py)
        forwards = None if reads_media(name) else base.concurrent_forwards
        encoder = Encoder.from_settings(base.replace(model=name, concurrent_forwards=forwards))
        # the explorer's attention maps (taps) need the transformers model: built at start (1.5-2 s,
        # model/handle.py), not in the middle of somebody's request
        _ = encoder.model
        if encoder.name in encoders:
            raise OptionError(f"--model {encoder.name!r} is given twice")
        encoders[encoder.name] = encoder
    return encoders


def _run_server(application, host: str, port: int, settings, sock=None) -> None:
    import sys

    import uvicorn

    from ..serve._protocol import uvicorn_config

    # the model thread gives the GIL up in every torch op and must win it back from the event loop:
    # a 1 ms switch interval (Python's default is 5) cuts that wait (benchmarks/serve_load.py)
    sys.setswitchinterval(0.001)
    # uvicorn handles SIGTERM/SIGINT: it stops accepting, finishes in-flight requests, then the
    # app's shutdown drains the batcher's queue
    config = uvicorn_config(application, host, port, settings)
    uvicorn.Server(config).run(sockets=[sock] if sock is not None else None)


@app.command()
@model_options(many=True)
def explore(
    text: Annotated[str | None, typer.Argument(help="A text to open the explorer on")] = None,
    store: StoreOption = None,
    host: Annotated[str, typer.Option(help="Address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free port)")] = 8000,
    open_browser: Annotated[
        bool, typer.Option("--open/--no-open", help="Open a browser when this machine has a display")
    ] = True,
    models: list[str] | None = None,  # --model, repeated (@model_options)
    settings: Settings = MODEL_SETTINGS,  # the model options (@model_options)
) -> None:
    """Open the layer explorer on a text: starts the server (as `layerwise serve`) and prints the URL."""
    from urllib.parse import urlencode

    setup_logging(quiet=False)
    _require_uvicorn("explore")
    if not _is_loopback(host):
        raise OptionError(
            f"--host {host!r}: explore binds loopback only; use layerwise serve --host with an API key"
        )
    from ..serve import ServeSettings, create_app

    # the views' hidden states with the final norm asked for (a decoder's layers on one scale:
    # --final-norm all); the logit lens reads every state through the norm whatever it is
    encoders = _load_encoders(models, settings.replace(concurrent_forwards=SERVE_FORWARDS))
    served = ServeSettings(concurrent_forwards=settings.concurrent_forwards)
    application = create_app(encoders, served, reference_store=store)
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    query = {k: v for k, v in (("text", text), ("model", next(iter(encoders)))) if v}
    url = f"http://{host}:{bound}/?{urlencode(query)}"
    err.print(f"layer explorer: {url}  (Ctrl-C stops it)", highlight=False, soft_wrap=True)
    if open_browser and _has_display():
        import threading
        import webbrowser

        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    _run_server(application, host, bound, served, sock)


def _bind(host: str, port: int):
    """A listening socket on host:port, else (port taken) on a free port, so the URL is known
    before the server starts."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for candidate in (port, 0) if port else (0,):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, candidate))
        except OSError:
            sock.close()
            if candidate == 0:
                raise
            err.print(f"port {port} is taken; using a free one", highlight=False)
            continue
        return sock
    raise OptionError(f"cannot bind {host}")


def _has_display() -> bool:
    """A graphical session to open a browser in (a text-mode browser in a terminal is no help)."""
    import sys

    return sys.platform in ("darwin", "win32") or bool(
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    )
