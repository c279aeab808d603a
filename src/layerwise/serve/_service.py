"""What the server serves: its models, settings, batcher and metrics, and the work of a request
(:class:`Service`); the routes (_routes.py), the explorer (_explorer.py) and the fast path in front of
FastAPI (_fast_path.py) take it as ``app.state.service``."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import Response
from starlette.concurrency import run_in_threadpool

from .._features.plan import OutputPlan
from .._settings.serve import ServeSettings
from ._admission import check_response_size, result_values, tokenise
from ._batcher import Batcher, Finish, Job
from ._media import FIELDS, check_fields, media_item, run_media
from ._metrics import Metrics
from ._responses import NPZ, ApiError, json_response, layer_item
from ._schemas import EmbeddingsRequest, LayersRequest
from ._served_schema import model_ids

if TYPE_CHECKING:
    from .._encoder import Encoder
    from .._inputs.raw import RawInputs


@dataclass
class Served:
    name: str
    encoder: Encoder


def served_names(encoders: Mapping[str, Encoder]) -> dict[str, Served]:
    """Model ids a request may name (served_schema.model_ids: full names and unique short ones)."""
    served = {name: Served(name, enc) for name, enc in encoders.items()}
    return {alias: served[name] for alias, name in model_ids(list(encoders)).items()}


class Service:
    """The served state: the models (by every name a request may use), the settings, the batcher
    that merges requests into runs, the metrics, and when the server started."""

    def __init__(
        self, encoders: Mapping[str, Encoder], settings: ServeSettings, batcher: Batcher, metrics: Metrics
    ) -> None:
        self.encoders, self.settings, self.batcher, self.metrics = dict(encoders), settings, batcher, metrics
        self.models = served_names(encoders)
        self.default_model = next(iter(encoders))
        self.started_at = int(time.time())

    def pick(self, model: str | None) -> Served:
        """The served model a request names (None: the first one), or a 404 naming those served."""
        if model is None:
            return self.models[self.default_model]
        if model not in self.models:
            raise ApiError(
                404,
                f"model {model!r} is not served here; served: {', '.join(sorted(self.models))}",
                param="model",
                code="model_not_found",
            )
        return self.models[model]

    async def run(
        self,
        served: Served,
        raw: RawInputs,
        plan: OutputPlan | None,
        *,
        bytes_per_value: float = 4.0,
        window: bool | None = None,
        max_tokens: int | None = None,
    ) -> tuple[list, int, list[bool]]:
        """Queue the inputs, wait for their results (the plan applied; None: every hidden state as a
        LayerStack): (results, tokens, truncated). ``bytes_per_value``: what one value of a result
        costs in the response, for its size bound; ``window``: long inputs in windows (default: the
        server's --long-texts); ``max_tokens``: the request's token limit (default: the server's)."""
        enc = served.encoder
        n_hidden = enc.n_hidden_states
        plan = enc.settle(plan) if plan is not None else None  # its final norm: the request's or ours
        # the final norm the Encoder settles (every hidden state as LayerStacks: its default plan's)
        final_norm: Any = (plan or enc.settle(OutputPlan())).final_norm
        layers = plan.hidden_states(n_hidden) if plan is not None else tuple(range(n_hidden))
        if not len(raw):
            raise ApiError(422, f"{raw.field} is an empty list; send at least one input", param=raw.field)
        # what the forward does is what the plan (recorded in the response) says: its long texts, stride
        if plan is not None:
            window, stride = plan.long_texts == "window", plan.stride
        else:  # every hidden state as a LayerStack (the explorer): windows when asked, else the server's
            window = self.settings.long_texts == "window" if window is None else window
            stride = self.settings.stride
        limit = (
            (max_tokens, "--max-explore-tokens")
            if max_tokens
            else (self.settings.max_request_tokens, "--max-request-tokens")
        )
        encoded = await _off_loop(_size(raw), tokenise, enc, raw, self.settings, len(layers), window, limit)
        values = result_values(plan, encoded, enc.hidden_size, n_hidden)
        check_response_size(int(values * bytes_per_value), self.settings.max_response_bytes)
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def done(results, error) -> None:
            loop.call_soon_threadsafe(_settle, future, results, error)

        finish = Finish(layers, plan, n_hidden)
        job = Job(
            served.name,
            encoded,
            finish,
            done,
            stride=stride if window else None,
            final_norm=final_norm,
            n_bytes=int(values * 4),
        )
        self.batcher.submit(job)  # a full queue: QueueFullError, 429 (serve/errors.py maps every error)
        results = await future  # this request's own failure in the run (the batcher re-ran it apart)
        return [results[i] for i in range(len(encoded))], job.n_tokens, [item.truncated for item in encoded]

    async def answer_embeddings(self, body: EmbeddingsRequest) -> dict:
        """The response body of ``POST /v1/embeddings`` (an ApiError for a refused request): the
        route below and the fast path in front of FastAPI (_fast_path.py) both answer with it."""
        served = self.pick(body.model)
        modality = served.encoder.modality
        if modality != "text":  # OpenAI's route is for texts
            raise ApiError(
                422,
                f"model {served.name!r} reads {modality}; /v1/embeddings takes text only. Send "
                f"{FIELDS[modality]} to /v1/layers with pool sentence:mean (or sentence:cls)",
                param="model",
            )
        texts = [body.input] if isinstance(body.input, str) else body.input
        if not texts:
            raise ApiError(422, "input is an empty list; send at least one text", param="input")
        plan = served.encoder.settle(body.plan(served.encoder.sentence_transformers, self.settings))
        width = plan.row_shape(served.encoder.hidden_size, served.encoder.n_hidden_states)
        if len(width) == 2 and width[0] != 1:
            raise ApiError(
                422,
                f"layers={body.layers!r} gives {width[0]} vectors per input and /v1/embeddings "
                "returns one: add fuse (e.g. concat_last4, mean_all), or use /v1/layers",
                param="layers",
            )
        if body.dimensions is not None and body.dimensions != width[-1]:
            raise ApiError(
                422,
                f"dimensions={body.dimensions} is not supported: these vectors have "
                f"{width[-1]} dimensions and layerwise does not cut or project them; leave "
                "dimensions out",
                param="dimensions",
            )
        per_value = 20.0 if body.encoding_format == "float" else 4 * 4 / 3  # a float as JSON text; base64
        results, n_tokens, truncated = await self.run(served, body.raw(), plan, bytes_per_value=per_value)
        data = []
        for i, result in enumerate(results):
            vector = result.vector.reshape(-1).astype(np.float32)
            value: Any = (
                vector.tolist()
                if body.encoding_format == "float"
                else base64.b64encode(vector.astype("<f4").tobytes()).decode()
            )
            data.append({"object": "embedding", "index": i, "embedding": value, "truncated": truncated[i]})
        return {
            "object": "list",
            "data": data,
            "model": served.name,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }

    async def answer_layers(self, body: LayersRequest, *, as_npz: bool) -> Response:
        """The answer to ``POST /v1/layers``: JSON, or the .npz file (``as_npz``: the request's
        Accept header asks for application/x-npz)."""
        served = self.pick(body.model)
        encoder = served.encoder
        field = check_fields(served.name, encoder.modality, body.sent())
        plan = encoder.settle(body.plan(self.settings))
        if field in FIELDS.values():  # an image or a speech model: its inputs decoded here
            results, n_tokens = await run_media(self, served, getattr(body, field), field, plan, as_npz)
            texts, pairs, item = [f"{field}[{i}]" for i in range(len(results))], None, media_item
        else:
            raw = body.raw()
            per_value = (2 if plan.dtype == "float16" else 4) * (1 if as_npz else 4 / 3)  # base64 in JSON
            results, n_tokens, _ = await self.run(served, raw, plan, bytes_per_value=per_value)
            texts, pairs, item = raw.texts, raw.text_pairs, layer_item
        meta = {
            "model": served.name,
            **plan.meta(encoder.n_hidden_states),
            "max_length": encoder.max_length,
            "model_dtype": encoder.model_dtype,
        }
        if as_npz:
            from .._files.writers import npz_bytes

            content = await run_in_threadpool(
                npz_bytes,
                enumerate(results),
                texts=texts,
                text_pairs=pairs,
                meta=meta,
                dtype=plan.dtype,
            )
            return Response(content, media_type=NPZ)
        work = n_tokens * len(meta["layers"])
        items = await _off_loop(work, lambda: [item(i, r, plan.dtype) for i, r in enumerate(results)])
        usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
        body_out = {"object": "layers", **meta, "results": items, "usage": usage}
        return await _off_loop(work, json_response, body_out)


# Work below this size runs on the event loop: a hop to the thread pool costs more than it, and
# every extra thread contending for the GIL slows the model thread (each torch op gives the GIL up
# and must win it back).
_INLINE_WORK = 20_000


def _size(raw: RawInputs) -> int:
    return sum(len(t) for t in raw.texts) + sum(len(t) for t in raw.text_pairs or ())


async def _off_loop(work: int, function, *args):
    """``function(*args)`` inline when ``work`` is small, else in the thread pool."""
    if work <= _INLINE_WORK:
        return function(*args)
    return await run_in_threadpool(function, *args)


def _settle(future, results, error) -> None:
    if future.done():  # the client went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(results)
