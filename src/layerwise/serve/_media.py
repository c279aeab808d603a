"""Images and sound over HTTP: ``POST /v1/layers`` of an image or a speech model.

A request sends ``images`` (or ``audio``): each a base64 string, a ``data:`` URL, or a ``file:`` URL
of a file under the server's ``--media-root`` (without one, the server reads no file a request
names). The inputs are decoded and counted before any model work: their units (an image's, at the
model's size; a clip's frames) bound the response (413) and join the queue's count (429) while the
model runs them. An image or speech model runs in the server's own process, one request at a time
(``Batcher.side_work``), through the same calls as ``Encoder.iter_results``: the answer equals
``enc.extract`` of the same files.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import numpy as np
from starlette.concurrency import run_in_threadpool

from .._results import LayerStack, to_dtype
from ..errors import InputError
from ._admission import check_response_size
from ._responses import ApiError, b64_array, layer_item
from ._schemas import INPUT_HELP

if TYPE_CHECKING:
    from .._features.plan import OutputPlan
    from .._settings.serve import ServeSettings

FIELDS = {"image": "images", "audio": "audio"}  # the request field of each modality


def check_fields(name: str, modality: str, given: dict[str, bool]) -> str:
    """The request field that carries ``modality``'s inputs, once the request sends that one: a
    text model sent images, or an image model sent texts, is a 422 naming the field to use."""
    field = FIELDS.get(modality, "texts")
    sent = [f for f, present in given.items() if present]
    # a text request's own rules (one of texts, pairs, words) are normalize_inputs' to say
    fits = set(sent) <= {"texts", "pairs", "words"} if field == "texts" else sent == [field]
    if not fits:
        reads = {"image": "images", "audio": "sound", "text": "text"}[modality]
        raise ApiError(
            422,
            f"model {name!r} reads {reads}: send {field}"
            + (f" ({INPUT_HELP})" if field != "texts" else " (or pairs, or words)")
            + (f", not {', '.join(sent)}" if sent else ""),
            param=sent[0] if sent else field,
        )
    return field


def decode_inputs(values: list[str], field: str, settings: ServeSettings) -> list[bytes]:
    """Each input's bytes: base64, a ``data:`` URL, or a ``file:`` URL under ``--media-root``."""
    if len(values) > settings.max_inputs:
        raise ApiError(
            413,
            f"{len(values):,} inputs in one request; this server takes at most {settings.max_inputs:,} "
            "(--max-inputs): split them over several requests",
            code="too_many_inputs",
        )
    return [_bytes_of(value, f"{field}[{i}]", settings) for i, value in enumerate(values)]


def _bytes_of(value: str, where: str, settings: ServeSettings) -> bytes:
    if value.startswith("file:"):
        return _file_bytes(value, where, settings)
    data = value
    if value.startswith("data:"):
        header, comma, data = value.partition(",")
        if not comma or not header.endswith(";base64"):
            raise ApiError(
                422, f"{where}: a data: URL must be base64 (data:<type>;base64,<data>)", param=where
            )
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(
            422, f"{where} is not base64, a data: URL or a file: URL; send {INPUT_HELP}", param=where
        ) from None


def _file_bytes(url: str, where: str, settings: ServeSettings) -> bytes:
    """A ``file:`` URL's bytes, for a file under ``--media-root`` no larger than a request body."""
    root = settings.media_root
    if root is None:
        raise ApiError(
            422,
            f"{where} is a file: URL, and this server reads no files (start it with --media-root DIR to "
            "serve the files under DIR); send the file's bytes as base64",
            param=where,
        )
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise ApiError(422, f"{where}: a file: URL names a file on this machine (file:///path)", param=where)
    path = Path(unquote(parsed.path)).resolve()
    if not path.is_relative_to(Path(root).resolve()):
        raise ApiError(422, f"{where}: {path} is outside --media-root {str(root)!r}", param=where)
    if not path.is_file():
        raise ApiError(422, f"{where}: no file {path} under --media-root", param=where)
    size = path.stat().st_size
    if size > settings.max_body_bytes:
        raise ApiError(
            413,
            f"{where}: {path.name} has {size:,} bytes, more than a request body may (--max-body-mb)",
            code="input_too_large",
        )
    return path.read_bytes()


def prepared(encoder: Any, items: list[bytes], field: str) -> tuple[list[Any], list[int]]:
    """The inputs as the model run takes them, with each one's units: an image's bytes (its units
    are the model's, whatever its size: checked decodable here), a clip decoded and resampled."""
    try:
        if encoder.modality == "image":
            from .._inputs.images import open_image

            # decoded here: a bad image is this request's 422, before the queue
            images = [open_image(item, i)[0] for i, item in enumerate(items)]
            return images, [encoder.max_length] * len(items)
        clips = encoder.run.prepare(items, 0)
    except InputError as exc:
        raise ApiError(422, f"{field}: {exc}", param=field) from None
    rate = encoder.run.loaded.rate
    frames = [encoder.run.n_frames(len(samples)) for samples, _ in clips]
    return [(samples, rate) for samples, _ in clips], frames


@dataclass
class Admitted:
    """A request's media inputs, decoded and counted: what the model run takes, the units of each
    (as the run will keep them) and in all."""

    inputs: list[Any]
    units: list[int]
    n_units: int
    samples: list[np.ndarray]  # a clip's samples at the model's rate (the explorer's waveform)


def admitted(
    encoder: Any, settings: ServeSettings, values: list[str], field: str, window: bool, limit: tuple[int, str]
) -> Admitted:
    """``values`` decoded and counted, or the request's 413 (``limit``: the most units, and the
    option that sets it) or 422."""
    inputs, units = prepared(encoder, decode_inputs(values, field, settings), field)
    most = encoder.max_length
    counted = [n if window or not most else min(n, most) for n in units]
    n_units, (max_units, flag) = sum(counted), limit
    if n_units > max_units:
        raise ApiError(
            413,
            f"the inputs have {n_units:,} units; this server takes at most {max_units:,} per request "
            f"({flag}): split them",
            code="too_many_tokens",
        )
    samples = [item[0] for item in inputs] if encoder.modality == "audio" else []
    return Admitted(inputs, counted, n_units, samples)


def computed(batcher: Any, encoder: Any, plan: OutputPlan, admitted: Admitted) -> list[Any]:
    """The results of ``plan`` for the admitted inputs, in their order: the units count in the
    batcher's queue while they wait and run, one media run at a time (``Batcher.side_work``)."""
    with batcher.side_work(admitted.n_units):
        found = {i: result for i, _, result in encoder.iter_results(plan, admitted.inputs)}
    return [found[i] for i in range(len(admitted.inputs))]


async def run_media(
    service: Any, served: Any, values: list[str], field: str, plan: OutputPlan, as_npz: bool
) -> tuple[list[Any], int]:
    """``POST /v1/layers`` of an image or a speech model: the results of ``plan`` for ``values``
    (the request's ``field``) after the request's limits, and their units."""
    encoder, settings = served.encoder, service.settings
    window = plan.long_texts == "window"
    limit = (settings.max_request_tokens, "--max-request-tokens")
    taken = await run_in_threadpool(admitted, encoder, settings, values, field, window, limit)
    layers = plan.hidden_states(encoder.n_hidden_states)
    rows = taken.n_units if plan.level == "token" else len(taken.inputs)
    width = 1 if plan.fuse is not None else len(layers)
    per_value = (2 if plan.dtype == "float16" else 4) * (1 if as_npz else 4 / 3)  # base64 in JSON
    check_response_size(int(rows * width * encoder.hidden_size * per_value), settings.max_response_bytes)
    return await run_in_threadpool(computed, service.batcher, encoder, plan, taken), taken.n_units


def media_item(index: int, result: Any, dtype: str) -> dict:
    """One input's answer: an image's or a clip's units (names, kinds, a patch's row and column or
    a frame's times) and vectors; a pooled vector as for a text."""
    if not isinstance(result, LayerStack) or result.units is None:
        return layer_item(index, result, dtype)
    units = result.units
    item: dict[str, Any] = {
        "index": index,
        "units": list(result.tokens),
        "kinds": list(units.kinds),
        "truncated": result.truncated,
        "n_windows": result.n_windows,
    }
    if units.grid is not None:
        item["grid"] = units.grid.tolist()
        item["grid_shape"] = list(units.grid_shape) if units.grid_shape else None
    if units.times is not None:
        item["times"] = np.round(units.times, 6).tolist()
    item["hidden"] = b64_array(to_dtype(result.hidden, dtype, f"input {index}", result.layers), dtype)
    return item
