"""Request bodies of the service. Unknown fields are refused (a typo must not be ignored), types
are strict (no "3" for 3), and layerwise's own fields take the CLI's string forms."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from .._features.names import POOL_HELP, SENTENCE_POOLS, sentence_convention
from .._features.plan import OutputPlan, levelled_pool
from .._settings.serve import ServeSettings
from .._settings.settings import parse_final_norm
from ..errors import OptionError
from ._responses import ApiError

if TYPE_CHECKING:
    from .._inputs.raw import RawInputs

LayerValue = str | int | list[int]


def _final_norm(value: object) -> object:
    """The CLI's spellings mean what they mean there: "last" is true, "none" is false."""
    if isinstance(value, str):
        if value not in ("last", "none", "all"):  # not "true": strict types, as every field here
            raise ValueError(
                f"final_norm {value!r} is not valid; choose true, false, 'last', 'none' or 'all'"
            )
        return parse_final_norm(value)  # the CLI's one reading of them
    return value


# validated as bool | "all" once the CLI's spellings are read; the schema lists all of them
FinalNormValue = Annotated[
    bool | Literal["all"],
    BeforeValidator(_final_norm, json_schema_input_type=bool | Literal["last", "none", "all"]),
]
FINAL_NORM_HELP = (
    'Decoder LMs: the final norm on the last hidden state (true or "last", as transformers returns '
    'it), on none (false or "none") or on every one ("all", so that layers compare on one scale); '
    "default: the server's (--final-norm). An encoder has no final norm: leave it out"
)


# the pools /v1/embeddings takes, from their one list (_features/names.py)
SENTENCE_POOL_CHOICES = " | ".join(f"sentence:{mode}" for mode in SENTENCE_POOLS)


def _long_texts(settings: ServeSettings) -> dict[str, Any]:
    """The server's long-text handling, as a plan takes it (the requests do not choose it)."""
    stride = settings.stride if settings.long_texts == "window" else None
    return {"long_texts": settings.long_texts, "stride": stride}


INPUT_FIELDS = ("texts", "pairs", "words", "images", "audio")  # a /v1/layers request sends one
# how an image or a clip travels in a request (serve/_media.py reads them)
INPUT_HELP = (
    "base64 of the file's bytes, a data: URL (data:image/png;base64,...), or a file: URL of a file "
    "under the server's --media-root"
)


def one_of(fields: Sequence[str]) -> list[Any]:
    """JSON Schema for "exactly one of ``fields``" (_served_schema.py narrows it to those served)."""
    if len(fields) == 1:
        return [{"required": list(fields)}]
    return [
        {"required": [f], "not": {"anyOf": [{"required": [o]} for o in fields if o != f]}} for f in fields
    ]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class EmbeddingsRequest(StrictModel):
    """OpenAI's ``POST /v1/embeddings`` body, plus layerwise's optional plan fields."""

    input: str | Annotated[list[str], Field(min_length=1)] = Field(
        description="A text or a non-empty list of texts (token-id arrays are not supported)"
    )
    model: str | None = Field(None, description="A served model (GET /v1/models); default: the first")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="Only the model's own width is accepted")
    user: str | None = None
    layers: LayerValue | None = Field(None, description="A layer spec: -1, 'last4', '0,4,-1'… (default: -1)")
    pool: str | None = Field(None, description=f"{SENTENCE_POOL_CHOICES} (default: the model's convention)")
    fuse: str | None = Field(None, description="A fusion (concat_last4, mean_all…) to get one vector")
    special_tokens: Literal["include", "exclude"] = "include"
    normalize: bool | None = Field(None, description="L2-normalise (default: the model's convention)")
    final_norm: FinalNormValue | None = Field(None, description=FINAL_NORM_HELP)

    def raw(self) -> RawInputs:
        """The request's texts."""
        from .._inputs.raw import normalize_inputs

        return normalize_inputs([self.input] if isinstance(self.input, str) else self.input)

    def plan(self, convention: Any, settings: ServeSettings) -> OutputPlan:
        """This request's plan, before the model settles it. Defaults follow the model's
        sentence-transformers ``convention`` (Encoder.encode): the last layer, its pooling, its
        normalisation; every field the request sets overrides them."""
        pool = self.pool
        if pool is None:  # the model's own pooling; one layerwise does not implement is an error
            try:
                pool = f"sentence:{sentence_convention(convention)[0]}"
            except OptionError as exc:
                raise ApiError(422, f"{exc}: pass pool (e.g. sentence:mean)", param="pool") from None
        normalize = bool(convention and convention.normalize) if self.normalize is None else self.normalize
        if not levelled_pool(pool).startswith("sentence:"):  # "mean" as Encoder.embed takes it is one
            raise ApiError(
                422,
                f"pool={pool!r}: /v1/embeddings returns one vector per input; use "
                f"{', '.join(f'sentence:{mode}' for mode in SENTENCE_POOLS)} (or the bare mode), "
                "or /v1/layers for token and word vectors",
                param="pool",
            )
        layers = self.layers if self.layers is not None or self.fuse is not None else -1
        return OutputPlan.parse(
            layers=layers,
            pool=pool,
            fuse=self.fuse,
            special_tokens=self.special_tokens,
            normalize=normalize,
            final_norm=self.final_norm,
            **_long_texts(settings),
        )


class LayersRequest(StrictModel):
    """``POST /v1/layers``: per input, tokens, offsets, word ids and the requested layers' vectors.
    Exactly one of ``texts`` (with ``text_pairs`` for pairs), ``pairs`` or ``words``, non-empty; or
    for an image or a speech model, ``images`` or ``audio`` (its units for its tokens)."""

    # the schema says what the server refuses: exactly one of the five inputs (schemathesis ST202)
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"oneOf": one_of(INPUT_FIELDS)})

    model: str | None = None
    texts: Annotated[list[str], Field(min_length=1)] | None = None
    text_pairs: list[str] | None = Field(None, description="Second segments, one per text")
    pairs: Annotated[list[list[str]], Field(min_length=1)] | None = Field(
        None, description="[first, second] per input"
    )
    words: Annotated[list[list[str]], Field(min_length=1)] | None = Field(
        None, description="Pre-split words, one list per input"
    )
    images: Annotated[list[str], Field(min_length=1)] | None = Field(
        None, description=f"An image model's inputs, each {INPUT_HELP}"
    )
    audio: Annotated[list[str], Field(min_length=1)] | None = Field(
        None, description=f"A speech model's inputs (WAV, FLAC, MP3, OGG), each {INPUT_HELP}"
    )
    layers: LayerValue = "all"
    pool: str = Field("token", description=POOL_HELP)
    fuse: str | None = None
    special_tokens: Literal["include", "exclude"] = "include"
    normalize: bool = False
    dtype: Literal["float32", "float16"] = "float32"
    final_norm: FinalNormValue | None = Field(None, description=FINAL_NORM_HELP)

    def plan(self, settings: ServeSettings) -> OutputPlan:
        """This request's plan, before the model settles it."""
        return OutputPlan.parse(
            layers=self.layers,
            pool=self.pool,
            fuse=self.fuse,
            special_tokens=self.special_tokens,
            dtype=self.dtype,
            normalize=self.normalize,
            final_norm=self.final_norm,
            **_long_texts(settings),
        )

    def sent(self) -> dict[str, bool]:
        """Which of the five input fields the request sends."""
        return {field: getattr(self, field) is not None for field in INPUT_FIELDS}

    def raw(self) -> RawInputs:
        """The request's inputs (an InputError is a 422 naming the field: _errors.py)."""
        from .._inputs.raw import normalize_inputs

        pairs: Any = self.pairs  # [first, second] lists: normalize_inputs checks that each has two
        return normalize_inputs(self.texts, text_pairs=self.text_pairs, pairs=pairs, words=self.words)


# ------------------------------------------------------------------------------------ responses
# What the endpoints answer, for /openapi.json (and the schemathesis run that checks every answer
# against it). The fast path of /v1/embeddings answers exactly these shapes too.
class ErrorDetail(BaseModel):
    message: str
    type: Literal["invalid_request_error", "server_error"]
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """OpenAI's error shape; every refusal and failure of this service answers with it."""

    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingItem(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float | None] | str = Field(
        description="The vector: floats (null for a NaN), or base64 of its little-endian float32 bytes"
    )
    truncated: bool


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    usage: Usage


class LayersResponse(BaseModel):
    """The plan's metadata (layers, level, pool, fuse, dtype, …) and one item per input."""

    model_config = ConfigDict(extra="allow")
    object: Literal["layers"]
    model: str
    layers: list[int]
    results: list[dict]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    n_hidden_states: int
    hidden_size: int
    max_length: int
    modality: Literal["text", "image", "audio"]


class ModelsResponse(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class QueueState(BaseModel):
    requests: int
    tokens: int


class HealthResponse(BaseModel):
    status: Literal["ok", "stopped"]
    models: list[str]
    queue: QueueState


def error_responses(*statuses: int) -> dict:
    """``responses=`` of a route: these statuses answer an :class:`ErrorBody`."""
    reasons = {
        401: "API key missing or wrong",
        404: "model not served",
        413: "over a size limit",
        422: "a bad value (the message names the field)",
        429: "the queue is full (see Retry-After)",
        500: "a failure of this request (code internal_error or nonfinite_output)",
        503: "the model process is gone",
    }
    return {status: {"model": ErrorBody, "description": reasons[status]} for status in statuses}
