"""Request bodies of the service. Unknown fields are refused (a typo must not be ignored), types
are strict (no "3" for 3), and layerwise's own fields take the CLI's string forms."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

LayerValue = str | int | list[int]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class EmbeddingsRequest(_Strict):
    """OpenAI's ``POST /v1/embeddings`` body, plus layerwise's optional plan fields."""

    input: str | list[str] = Field(
        description="A text or a list of texts (token-id arrays are not supported)"
    )
    model: str | None = Field(None, description="A served model (GET /v1/models); default: the first")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="Only the model's own width is accepted")
    user: str | None = None
    layers: LayerValue | None = Field(None, description="A layer spec: -1, 'last4', '0,4,-1'… (default: -1)")
    pool: str | None = Field(
        None, description="sentence:mean | sentence:cls | sentence:max (default: the model's convention)"
    )
    fuse: str | None = Field(None, description="A fusion (concat_last4, mean_all…) to get one vector")
    special_tokens: Literal["include", "exclude"] = "include"
    normalize: bool | None = Field(None, description="L2-normalise (default: the model's convention)")


class LayersRequest(_Strict):
    """``POST /v1/layers``: per input, tokens, offsets, word ids and the requested layers' vectors."""

    model: str | None = None
    texts: list[str] | None = None
    text_pairs: list[str] | None = Field(None, description="Second segments, one per text")
    pairs: list[list[str]] | None = Field(None, description="[first, second] per input")
    words: list[list[str]] | None = Field(None, description="Pre-split words, one list per input")
    layers: LayerValue = "all"
    pool: str = Field(
        "token", description="token | word:first|last|mean|first_last|max | sentence:mean|cls|max"
    )
    fuse: str | None = None
    special_tokens: Literal["include", "exclude"] = "include"
    normalize: bool = False
    dtype: Literal["float32", "float16"] = "float32"
