"""The service's response bodies: OpenAI-shaped errors, base64 arrays, per-layer items, JSON."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np
from fastapi import Response

from .._results import LayerStack, SentenceVector, WordVectors, to_dtype

NPZ = "application/x-npz"  # the media type of an .npz answer (Accept: application/x-npz)

try:
    import orjson as _orjson
except ImportError:  # fastapi installed without the serve extra: the standard library, slower
    _orjson = None  # type: ignore[assignment]


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def b64_array(array: np.ndarray, dtype: str) -> dict:
    """An array as base64 of its little-endian bytes, with dtype and shape (numpy:
    ``np.frombuffer(base64.b64decode(data), dtype).reshape(shape)``)."""
    little = np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<"))
    return {"dtype": dtype, "shape": list(little.shape), "data": base64.b64encode(little.tobytes()).decode()}


def json_response(body: dict) -> Response:
    """A JSON response of ``body`` (see :func:`json_bytes`)."""
    return Response(json_bytes(body), media_type="application/json")


def json_bytes(body: dict) -> bytes:
    """JSON without FastAPI's jsonable_encoder, which walks every float of every vector in Python.

    orjson (the ``serve`` extra) writes floats about 10x faster than the standard library, which
    matters on the event loop: 384 floats per embedding at hundreds of requests/s. Both write the
    shortest text that reads back as the same float64, so the numbers are the same; a NaN or inf
    (a broken model: the engine has logged it) becomes null, as in layerwise's JSON Lines files."""
    if _orjson is not None:
        return _orjson.dumps(body, option=_orjson.OPT_SERIALIZE_NUMPY)
    try:
        text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError:  # a NaN or inf somewhere: walk the body once more
        text = json.dumps(_finite(body), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8")


def _finite(value: Any) -> Any:
    """``value`` with NaN and inf floats replaced by None (strict JSON has no NaN), as orjson does."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def layer_item(index: int, result: Any, dtype: str) -> dict:
    where = f"input {index}"
    if isinstance(result, LayerStack):
        return {
            "index": index,
            "tokens": list(result.tokens),
            "offsets": result.offsets.tolist(),
            "word_ids": result.word_ids.tolist(),
            "segment_ids": result.segment_ids.tolist(),
            "truncated": result.truncated,
            "n_windows": result.n_windows,
            "words_empty": list(result.words_empty),
            "hidden": b64_array(to_dtype(result.hidden, dtype, where, result.layers), dtype),
        }
    if isinstance(result, WordVectors):
        return {
            "index": index,
            "words": list(result.words),
            "word_spans": result.spans.tolist(),
            "word_segment_ids": result.segment_ids.tolist(),
            "n_subwords": result.n_subwords.tolist(),
            "words_lost": result.words_lost,
            "words_empty": list(result.words_empty),
            "word_vectors": b64_array(
                to_dtype(result.vectors, dtype, where, () if result.fuse else result.layers), dtype
            ),
        }
    assert isinstance(result, SentenceVector)
    vector = to_dtype(result.vector, dtype, where)
    return {"index": index, "truncated": result.truncated, "embedding": b64_array(vector, dtype)}


def validation_error(errors: list) -> ApiError:
    """pydantic's errors of a request body (locations start with "body", as FastAPI reports them)
    as one 422 naming the fields (at most five) and what they take."""
    # an empty list in a union (input: str | list[str]) fails both branches: the empty list is the news
    errors = [e for e in errors if e.get("type") == "too_short"] or errors
    messages = list(dict.fromkeys(describe_validation_error(e) for e in errors[:5]))
    first = errors[0]["loc"][1:2] if errors else ()
    param = first[0] if first and isinstance(first[0], str) else None  # a field, not a JSON position
    code = "invalid_json" if any(e.get("type") == "json_invalid" for e in errors) else None
    return ApiError(422, "; ".join(messages) or "the body is not valid", param=param, code=code)


def describe_validation_error(error: dict) -> str:
    """One pydantic error as a sentence naming the field and what it takes."""
    path = error.get("loc", ())[1:]
    loc = ".".join(str(p) for p in path) or "body"
    if path == ("input",) and error.get("type") == "extra_forbidden":  # OpenAI's field on /v1/layers
        return "this endpoint takes texts (or pairs, or words), not input: input is /v1/embeddings' field"
    if error.get("type") == "too_short":
        return f"{path[0] if path else loc} is an empty list; send at least one input"
    if path[:1] == ("input",):
        return "input must be a string or a list of strings (token-id arrays are not supported)"
    if not path and error.get("type") in ("model_attributes_type", "model_type", "dict_type"):
        return "the body must be a JSON object; send Content-Type: application/json"
    if error.get("type") == "extra_forbidden":
        return f"unknown field {loc!r}; see the request schema at /openapi.json"
    if error.get("type") == "json_invalid":
        return f"the body is not valid JSON ({error.get('ctx', {}).get('error', 'parse error')})"
    if error.get("type") == "missing":
        return f"{loc} is required"
    return f"{loc}: {error.get('msg')}"
