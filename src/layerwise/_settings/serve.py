"""A server's settings and limits (sizes, queue, timeouts, API key, long-text default), one frozen
value: ``ServeSettings``. Each field made with :func:`limit` is an option of ``layerwise serve``
(cli/_serve.py makes them from the fields, as cli/_options.py makes the model options from
Settings): its help, bounds and, where the command line spells it otherwise, the option's name, type
and how its value becomes the field's. Torch- and FastAPI-free: ``layerwise --help`` reads it."""

from __future__ import annotations

import dataclasses
import os
import typing
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import OptionError
from .long_texts import LongTexts, check_long_texts

API_KEY_ENV = "LAYERWISE_API_KEY"
MAX_LIMIT = 2**40  # a count or byte size past this is no limit: a typo, or inf
MB = 2**20


def read_api_key(path: str | os.PathLike | None) -> str | None:
    """The API key from a file (first line), else from $LAYERWISE_API_KEY, else None. Never from the
    command line, where ``ps`` shows it to every user of the machine."""
    if path is not None:
        path = Path(path)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise OptionError(f"--api-key-file {str(path)!r} cannot be read: {exc.strerror}") from None
        key = lines[0].strip() if lines else ""
        if not key:
            raise OptionError(f"--api-key-file {str(path)!r} is empty; write the key on its first line")
        return key
    key = os.environ.get(API_KEY_ENV, "").strip()
    return key or None


def media_folder(path: str | os.PathLike | None) -> Path | None:
    """``--media-root``: an existing folder, resolved (a request's file: URL must lie under it)."""
    if path is None:
        return None
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise OptionError(f"--media-root {str(path)!r} is not a folder; name the folder of the files served")
    return folder


def limit(
    default: Any,
    help: str,
    *,
    option: tuple[str, object, Any, Callable[[Any], Any]] | None = None,
    min: float | None = None,
    max: float | None = None,
) -> Any:
    """A field of ServeSettings that is an option of ``layerwise serve``: ``help`` its line, ``min``
    and ``max`` its bounds; ``option``: ``(name, type, default, to_value)`` where the command line
    spells it otherwise than the field (a size in MB for one in bytes, a key's file for the key)."""
    bounds = {k: v for k, v in (("min", min), ("max", max)) if v is not None}
    return dataclasses.field(default=default, metadata={"help": help, "option": option, "bounds": bounds})


def in_mb(name: str, default_bytes: int, help: str, most_mb: float) -> Any:
    """A byte size that the command line takes in MB, as option ``name`` (at most ``most_mb``: the
    bytes are held in memory whole, so past that a limit is no limit)."""
    option = (name, float, default_bytes / MB, lambda mb: int(mb * MB))
    return limit(default_bytes, help, option=option, min=0.001, max=most_mb)


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """Limits of one server. A request over a size limit gets 413, a full queue 429."""

    api_key: str | None = limit(
        None,
        "File whose first line is the API key [default: $LAYERWISE_API_KEY]",
        option=("api_key_file", Path | None, None, read_api_key),
    )
    max_batch_tokens: int = limit(16_384, "Tokens gathered for one model run", min=1)
    # how long the oldest request waits for others to join its run. With two concurrent forwards a longer wait
    # gathers every client into one run on one stream: at 8 clients 5 ms kept one core busy (0.4x
    # offline tokens/s) where 2 ms kept both (0.56x); at 32 clients 1, 2 and 5 ms were alike (0.78-
    # 0.82x; interleaved A/B, docs/serving-performance.md). A lone client never waits
    # (Batcher._wait_left)
    max_wait_ms: float = limit(2.0, "Longest wait for a run to fill (ms)", min=0, max=1000)
    max_inputs: int = limit(2048, "Inputs per request (else 413)", min=1)  # texts, pairs or word lists
    max_request_tokens: int = limit(131_072, "Tokens per request (else 413)", min=1)  # after tokenising
    max_queue_tokens: int = limit(1_048_576, "Tokens waiting (else 429)", min=1)
    max_body_bytes: int = in_mb("max_body_mb", 8 * MB, "Request body size (else 413)", 1024.0)
    # the vectors a response carries, counted before any work (one row per token at token and word
    # level, one per input at sentence level; base64 in JSON is 4/3 of that)
    max_response_bytes: int = in_mb(
        "max_response_mb", 64 * MB, "Vectors in one response (else 413; npz or a store for more)", 16384.0
    )
    # the vectors of the requests queued and running (a lone request always runs)
    max_queue_bytes: int = in_mb(
        "max_queue_mb", 512 * MB, "Vectors of the requests queued and running (else 429)", 65536.0
    )
    max_explore_tokens: int = limit(2048, "Tokens of an explorer text (else 413)", min=1)  # /v1/explore/*
    # a slow client is cut (408) when its request's headers, then its body, take longer than these
    header_timeout_s: float = limit(
        10.0,
        "Seconds for a request's headers to arrive (else 408)",
        option=("header_timeout", float, 10.0, float),
        min=0.001,
        max=3600,
    )
    body_timeout_s: float = limit(
        60.0,
        "Seconds for a request's body to arrive (else 408)",
        option=("body_timeout", float, 60.0, float),
        min=0.001,
        max=3600,
    )
    # a request names files only under this folder (file: URLs of images and audio); none without it
    media_root: Path | None = limit(
        None,
        "Folder whose images and audio requests may name by file: URL [default: none, base64 only]",
        option=("media_root", Path | None, None, media_folder),
    )
    long_texts: LongTexts = limit(
        "truncate",
        "Inputs over the model maximum, where a request does not say: truncate, or sliding windows",
    )
    stride: int | None = limit(None, "Window step in tokens [default: half a window]", min=1)
    # not options: ``layerwise serve`` sets them. Model runs at once, each on its share of torch's
    # threads (None: 1 in-process; in the model process the default of extraction,
    # forward/concurrent.py's default_forwards)
    concurrent_forwards: int | None = None
    # run the models in a process of their own (model_process.py): the event loop does not hold
    # their GIL; CPU only (``layerwise serve`` turns it on there)
    model_process: bool = False
    # the earlier name of concurrent_forwards: accepted with a warning for one release (not a field)
    streams: dataclasses.InitVar[int | None] = None

    def __post_init__(self, streams: int | None) -> None:
        if streams is not None:
            warnings.warn(
                f"ServeSettings(streams={streams!r}) is deprecated and goes in the next release: use "
                f"concurrent_forwards={streams!r}",
                FutureWarning,
                stacklevel=3,
            )
            object.__setattr__(self, "concurrent_forwards", streams)
        for name in (
            "max_body_bytes",
            "max_inputs",
            "max_request_tokens",
            "max_batch_tokens",
            "max_queue_tokens",
            "max_response_bytes",
            "max_queue_bytes",
            "max_explore_tokens",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
                raise OptionError(f"{name}={value!r} must be a whole number from 1 to {MAX_LIMIT:,} (2**40)")
        if self.max_request_tokens > self.max_queue_tokens:
            raise OptionError(
                f"max_request_tokens={self.max_request_tokens} is larger than max_queue_tokens="
                f"{self.max_queue_tokens}: such a request could never be queued; raise the queue limit"
            )
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
                raise OptionError(f"{name}={value!r}: use a number of seconds above 0, at most 3600")
        if not 0 <= self.max_wait_ms <= 1000:
            raise OptionError(f"max_wait_ms={self.max_wait_ms!r}: use 0 to 1000 (a few ms is typical)")
        forwards = self.concurrent_forwards
        if forwards is not None and (
            isinstance(forwards, bool) or not isinstance(forwards, int) or forwards < 1
        ):
            raise OptionError(f"concurrent_forwards={forwards!r} must be a whole number >= 1 (or None)")
        check_long_texts(self.long_texts, self.stride)
        object.__setattr__(self, "media_root", media_folder(self.media_root))
        if self.api_key is not None and len(self.api_key) < 8:
            raise OptionError("the API key is shorter than 8 characters; use a long random one")


@dataclasses.dataclass(frozen=True)
class ServeOption:
    """A ServeSettings field as ``layerwise serve`` takes it: the option's ``name``, ``kind``,
    ``default``, ``help``, ``bounds`` and ``to_value`` (the field's value from the option's)."""

    field: str
    name: str
    kind: object
    default: Any
    help: str
    bounds: dict[str, float]
    to_value: Callable[[Any], Any]


def serve_options() -> list[ServeOption]:
    """Every ServeSettings field made with :func:`limit`, as an option, in the fields' order."""
    kinds = typing.get_type_hints(ServeSettings)
    found = []
    for field in dataclasses.fields(ServeSettings):
        meta = field.metadata
        if "help" not in meta:
            continue
        name, kind, default, to_value = meta["option"] or (field.name, kinds[field.name], field.default, None)
        found.append(
            ServeOption(field.name, name, kind, default, meta["help"], meta["bounds"], to_value or _as_is)
        )
    return found


def _as_is(value: Any) -> Any:
    return value
