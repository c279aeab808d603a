"""Images in: files, folders, globs, bytes, PIL images and arrays, decoded by Pillow into RGB.

    image_files(["photos/", "scans/*.png", "cat.jpg"])   # the files they name, in order
    open_image("cat.jpg", 0)                              # (RGB PIL image, "cat.jpg")

An image model's own processor (``AutoImageProcessor``) resizes, crops and normalises them
(_model/loading/media.py); nothing here changes a pixel beyond the decode to RGB.
"""

from __future__ import annotations

import glob
import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .._settings.extras import require
from ..errors import InputError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def image_files(sources: Iterable[str | os.PathLike]) -> list[str]:
    """The image files ``sources`` name: a file as it is, a folder's images (sorted, not its
    subfolders'), a glob's matches (sorted). A source that names no image is an error naming it."""
    return media_files(sources, IMAGE_SUFFIXES, "image")


def media_files(sources: Iterable[str | os.PathLike], suffixes: tuple[str, ...], noun: str) -> list[str]:
    """The files with ``suffixes`` that ``sources`` name (files, folders, globs; see
    :func:`image_files`); ``noun`` names what is looked for in the errors."""
    files: list[str] = []
    for source in sources:
        text = os.fspath(source)
        path = Path(text).expanduser()
        if path.is_dir():
            found = sorted(str(p) for p in path.iterdir() if _is_file_of(str(p), suffixes))
            where = f"folder {text!r} holds no {noun} ({', '.join(suffixes)})"
        elif path.is_file():
            found, where = [str(path)], ""
        elif glob.has_magic(text):
            found = sorted(p for p in glob.glob(os.path.expanduser(text)) if _is_file_of(p, suffixes))
            where = f"{text!r} matches no {noun} ({', '.join(suffixes)})"
        else:
            found, where = [], f"{noun} {text!r} does not exist; check the path"
        if not found:
            raise InputError(where)
        files.extend(found)
    return files


def _is_file_of(name: str, suffixes: tuple[str, ...]) -> bool:
    return Path(name).suffix.lower() in suffixes and os.path.isfile(name)


def names_media(source: str, suffixes: tuple[str, ...] = IMAGE_SUFFIXES) -> bool:
    """Whether ``source`` (a command-line input) names media files: one with ``suffixes``, a folder,
    a glob (a table of paths, a text file or standard input does not)."""
    path = Path(source).expanduser()
    return path.suffix.lower() in suffixes or path.is_dir() or glob.has_magic(source)


def open_image(item: Any, index: int) -> tuple[Any, str]:
    """``item`` as an RGB PIL image, and the name its results carry: a path (str or PathLike),
    encoded bytes, a PIL image, or an array ``(height, width)`` or ``(height, width, 3 or 4)`` of
    uint8 (0-255) or floats in [0, 1]. ``index``: its place in the call, for in-memory names."""
    image_module = _pil()
    if isinstance(item, str | os.PathLike):
        name = os.fspath(item)
        try:
            with image_module.open(name) as opened:
                return opened.convert("RGB"), name
        except FileNotFoundError:
            raise InputError(f"image {name!r} does not exist; check the path") from None
        except (OSError, ValueError) as exc:  # Pillow's UnidentifiedImageError is an OSError
            raise InputError(f"image {name!r} cannot be decoded ({exc}); pass PNG, JPEG or WebP") from exc
    name = f"<image {index}>"
    if isinstance(item, bytes | bytearray | memoryview):
        try:
            with image_module.open(io.BytesIO(bytes(item))) as opened:
                return opened.convert("RGB"), name
        except (OSError, ValueError) as exc:
            raise InputError(f"{name}: its bytes are no image Pillow can decode ({exc})") from exc
    if isinstance(item, image_module.Image):
        return item.convert("RGB"), name
    if isinstance(item, np.ndarray):
        return image_module.fromarray(_as_uint8(item, name)).convert("RGB"), name
    raise InputError(
        f"{name} is a {type(item).__name__}; an image model takes image paths, bytes, PIL images or "
        "arrays (height, width, 3)"
    )


def _as_uint8(array: np.ndarray, name: str) -> np.ndarray:
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (1, 3, 4)):
        raise InputError(f"{name}: an array of shape {array.shape}; pass (height, width[, 3])")
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.dtype == np.uint8:
        return array
    if np.issubdtype(array.dtype, np.floating):
        if not np.isfinite(array).all() or array.min() < 0 or array.max() > 1:
            raise InputError(f"{name}: float pixels must lie in [0, 1]; scale them, or pass uint8 (0-255)")
        return np.round(array * 255).astype(np.uint8)
    raise InputError(f"{name}: pixels of dtype {array.dtype}; pass uint8 (0-255) or floats in [0, 1]")


def _pil() -> Any:
    require("vision")
    from PIL import Image

    return Image


def media_corpus(sources: Iterable[str | os.PathLike], files: list[str], noun: str) -> Any:
    """A :class:`~layerwise.Corpus` of media ``files`` (found from ``sources``): its texts are the
    files' paths, which an image or a speech model's Encoder opens, and its outputs name."""
    from .corpus import Corpus

    given = [os.fspath(s) for s in sources]
    corpus = Corpus.from_inputs(files)
    corpus.reading = {"format": noun, "source": f"{len(files)} {noun} from {', '.join(given)}"}
    return corpus
