"""GGUF files (llama.cpp's format): what transformers' loaders take for one, and how layerwise
makes transformers' reading of it quiet and parse it once. Needs the ``gguf`` extra."""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...errors import MissingDependencyError


def gguf_parts(source: str) -> tuple[str, str] | None:
    """``(folder, file name)`` when ``source`` is a GGUF file (see resolve_model_source), else None."""
    if not source.endswith(".gguf"):
        return None
    path = Path(source)
    return str(path.parent), path.name


def loader_args(source: str) -> tuple[str, dict[str, Any]]:
    """What transformers' ``from_pretrained`` takes for ``source``: a GGUF file is its folder plus
    ``gguf_file`` (transformers de-quantises it to the requested dtype; needs the gguf package); a hub
    name is read from the local cache only when the hub cannot be reached (see model.hub)."""
    parts = gguf_parts(source)
    if parts is None:
        from .hub import hub_kwargs

        return source, hub_kwargs(source)
    try:
        import gguf  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(
            f"model {source!r} is a GGUF file; reading it needs the gguf package: "
            "pip install 'layerwise[gguf]'"
        ) from exc
    return parts[0], {"gguf_file": parts[1]}


@contextmanager
def gguf_loading() -> Iterator[None]:
    """While transformers reads a GGUF file: no de-quantising bar (a plain tqdm that no
    transformers setting turns off, and TQDM_DISABLE only when read at tqdm's import), and gguf's
    tensor-name map built once instead of once per module (395 times for SmolLM2: 5 of the 15 s
    its load took). Both are put back afterwards; the map is a pure function of its arguments."""
    import gguf as gguf_package
    from transformers import modeling_gguf_pytorch_utils as reader

    bar, name_map = reader.tqdm, gguf_package.get_tensor_name_map
    reader.tqdm = functools.partial(bar, disable=True)
    gguf_package.get_tensor_name_map = functools.cache(name_map)
    try:
        yield
    finally:
        reader.tqdm, gguf_package.get_tensor_name_map = bar, name_map


@contextmanager
def gguf_read_once(source: str) -> Iterator[None]:
    """While an encoder loads from a GGUF file: transformers reads it three times (the config, the
    tokenizer, the weights), each a whole parse of its metadata (seconds for a 49k-token
    vocabulary: 3 of SmolLM2's 14 s each); here the first parse serves all three. Nothing for
    other sources."""
    if gguf_parts(source) is None or importlib.util.find_spec("gguf") is None:  # (the loader says why)
        yield
        return
    import gguf

    gguf_package: Any = gguf  # its GGUFReader is replaced for the duration
    reader_class = gguf_package.GGUFReader
    readers: dict[tuple[str, str], Any] = {}

    def read(path: str | os.PathLike, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    gguf_package.GGUFReader = read
    try:
        yield
    finally:
        gguf_package.GGUFReader = reader_class
