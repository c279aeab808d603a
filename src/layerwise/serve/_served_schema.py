"""The OpenAPI schema of one running server: what its request bodies accept depends on the models it
serves, and ``/openapi.json`` says so. ``pool`` and ``fuse`` list their spellings (checked by
layerwise's own parser, whose messages name the fix, so they are listed here rather than typed as
literals); ``model`` lists the served names; ``final_norm`` takes "all" only
where a decoder LM is served (an encoder has no final norm); the explorer's attention ``layer`` stops
at the deepest served model's last layer; /v1/layers takes the input fields of the modalities
served (``images`` only where an image model is). What depends on the text itself (a token index past the
text's tokens) or on a model's checkpoint (a logit lens needs a language-model head) stays in words,
in the descriptions, as do rules between fields (``normalize`` needs a sentence pool): a schema
cannot say them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from .._features.names import FUSIONS, SENTENCE_POOLS
from .._features.plan import pool_spellings
from ._schemas import one_of


def describe_served(app: FastAPI, encoders: Mapping[str, Any]) -> None:
    """Make ``app.openapi()`` describe the bodies this server accepts with ``encoders`` (name ->
    Encoder) served; computed once, on the first request for the schema."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            narrow_to_served(schema, encoders)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def model_ids(names: list[str]) -> dict[str, str]:
    """The ids a request may name, each to its model's full name: the full names, and each one's
    last path component ("all-MiniLM-L6-v2") when no other model shares it."""
    ids = {name: name for name in names}
    short: dict[str, list[str]] = {}
    for name in names:
        short.setdefault(name.rstrip("/").rsplit("/", 1)[-1], []).append(name)
    for alias, full in short.items():
        if len(full) == 1 and alias not in ids:
            ids[alias] = full[0]
    return ids


def narrow_to_served(schema: dict[str, Any], encoders: Mapping[str, Any]) -> None:
    """Edit a generated schema in place (see the module docstring)."""
    names = list(model_ids(list(encoders)))
    any_decoder = any(getattr(enc, "is_decoder", False) for enc in encoders.values())
    deepest = max(int(enc.n_layers) for enc in encoders.values())
    for name, body in schema.get("components", {}).get("schemas", {}).items():
        if not name.endswith("Request"):
            continue
        fields = body.get("properties", {})
        if "pool" in fields:
            sentence_only = name == "EmbeddingsRequest"
            pools = [
                p
                for p in pool_spellings()
                if not sentence_only or p.startswith("sentence:") or p in SENTENCE_POOLS
            ]
            _enum(fields["pool"], pools)
        if "fuse" in fields:
            _enum(fields["fuse"], list(FUSIONS))
        if "model" in fields:
            fields["model"]["anyOf"] = [{"type": "string", "enum": names}, {"type": "null"}]
            fields["model"]["description"] = f"A served model (GET /v1/models); default: {names[0]!r}"
        if "final_norm" in fields and not any_decoder:
            fields["final_norm"]["anyOf"] = [
                {"type": "boolean"},
                {"type": "string", "enum": ["last", "none"]},
                {"type": "null"},
            ]
            fields["final_norm"]["description"] += ' (this server serves encoders only: "all" is refused)'
        if name == "LayersRequest":
            _inputs_served(body, {getattr(enc, "modality", "text") for enc in encoders.values()})
        if name == "AttentionRequest" and "layer" in fields:
            fields["layer"]["maximum"] = deepest
            fields["layer"]["description"] = (
                f"Layer 1..n_layers of the model (the deepest served model has {deepest})"
            )


def _enum(field: dict[str, Any], values: list[str]) -> None:
    """A string field (optional or not) that takes one of ``values``."""
    if "anyOf" in field:
        field["anyOf"] = [
            {"type": "string", "enum": values},
            *(t for t in field["anyOf"] if t.get("type") == "null"),
        ]
    else:
        field["enum"] = values


# the modality each input field of /v1/layers carries
FIELD_MODALITY = {"texts": "text", "pairs": "text", "words": "text", "images": "image", "audio": "audio"}


def _inputs_served(body: dict[str, Any], modalities: set[str]) -> None:
    """/v1/layers' input fields of the modalities served, and "exactly one of them"."""
    fields = body.get("properties", {})
    kept = [f for f, modality in FIELD_MODALITY.items() if modality in modalities and f in fields]
    for field in FIELD_MODALITY:
        if field not in kept:
            fields.pop(field, None)
    if "text" not in modalities:
        fields.pop("text_pairs", None)
    body["oneOf"] = one_of(kept)
