"""Hub names without a network: decide once per process whether the Hugging Face hub can be reached,
and when it cannot, load hub names from the local cache only. Without this, every file transformers
asks for retries five times with backoff (about 25 s) before it says "not found" on a machine with no
network and no ``HF_HUB_OFFLINE`` set."""

from __future__ import annotations

import functools
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

_PROBE_SECONDS = 3.0


def is_hub_name(source: str) -> bool:
    """A name for the hub, not a local folder or a GGUF file (see resolve_model_source)."""
    return not source.endswith(".gguf") and not Path(source).is_dir()


def _endpoint() -> tuple[str, int]:
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def _connects(host: str, port: int) -> bool:
    """Whether one TCP connection to the hub opens within the probe's time (DNS included)."""
    answer: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=_PROBE_SECONDS):
                answer.append(True)
        except OSError:
            answer.append(False)

    # getaddrinfo has no timeout of its own: a thread bounds the whole probe
    thread = threading.Thread(target=probe, daemon=True, name="layerwise-hub-probe")
    thread.start()
    thread.join(_PROBE_SECONDS + 0.5)
    return bool(answer and answer[0])


@functools.cache
def hub_offline() -> bool:
    """True when hub names must come from the local cache: ``HF_HUB_OFFLINE`` is set, or the hub's
    host cannot be reached (asked once per process)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return True
    return not _connects(*_endpoint())


def hub_kwargs(source: str) -> dict[str, bool]:
    """What ``from_pretrained``/``cached_file`` take for ``source`` beyond its location: cache-only
    loading for a hub name when the hub cannot be reached."""
    return {"local_files_only": True} if is_hub_name(source) and hub_offline() else {}


def cache_folder() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)
