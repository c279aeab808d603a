"""The explorer's view of an image or a sound: ``POST /v1/explore/media``.

Every hidden state of one image or clip (through the same admission and run as ``/v1/layers``,
serve/_media.py), and per layer and unit the statistics of the text grid
(:func:`layerwise.explore.token_statistics`): the page colours an image's patches, or a strip of a
clip's frames under its waveform, by them. An image comes back as the model read it (resized,
cropped: its processor's pixels, the normalisation undone), so that the patches lie where the
model saw them; a clip comes back as its waveform's envelope at the model's rate.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
from pydantic import Field

from ._explorer_views import nullable
from ._media import FIELDS, admitted, computed
from ._responses import ApiError
from ._schemas import INPUT_HELP, StrictModel

ENVELOPE_BINS = 1200  # waveform columns sent to the page (its canvas is narrower)


class MediaRequest(StrictModel):
    model: str | None = None
    input: str = Field(min_length=1, description=f"One image or clip: {INPUT_HELP}")


def media_view(explorer: Any, served: Any, body: MediaRequest) -> dict:
    """Units, their places and statistics per layer, and what the page draws them over."""
    from .._features.plan import OutputPlan
    from ..explore import token_statistics

    encoder = served.encoder
    if encoder.modality == "text":
        raise ApiError(
            422,
            f"model {served.name!r} reads text: the text views (/v1/explore/tokens) show it",
            param="model",
        )
    field = FIELDS[encoder.modality]
    limit = (explorer.max_tokens, "--max-explore-tokens")
    taken = admitted(encoder, explorer.settings, [body.input], field, True, limit)
    plan = encoder.settle(OutputPlan.parse(layers="all", pool="token", long_texts="window"))
    stack = computed(explorer.batcher, encoder, plan, taken)[0]
    units = stack.units
    statistics = {name: nullable(values) for name, values in token_statistics(stack).items()}
    answer: dict[str, Any] = {
        "model": served.name,
        "modality": encoder.modality,
        "layers": list(stack.layers),
        "units": list(stack.tokens),
        "kinds": list(units.kinds),
        "statistics": statistics,
        "n_windows": stack.n_windows,
    }
    if encoder.modality == "image":
        answer["grid"] = units.grid.tolist()
        answer["grid_shape"] = list(units.grid_shape)
        answer["image"] = model_view(encoder, taken.inputs[0])
    else:
        answer["times"] = np.round(units.times, 6).tolist()
        answer["waveform"] = envelope(taken.samples[0], encoder.run.loaded.rate)
    return answer


def model_view(encoder: Any, image: Any) -> str:
    """``image`` as the model reads it, a PNG data URL: the processor's pixels with its normalisation
    and rescaling undone."""
    from PIL import Image

    processor = encoder.processor
    pixels = processor(images=[image], return_tensors="pt")["pixel_values"][0].numpy().astype(np.float64)
    if getattr(processor, "do_normalize", False):
        mean = np.asarray(processor.image_mean, dtype=np.float64).reshape(-1, 1, 1)
        std = np.asarray(processor.image_std, dtype=np.float64).reshape(-1, 1, 1)
        pixels = pixels * std + mean
    if getattr(processor, "do_rescale", True):
        pixels = pixels / float(getattr(processor, "rescale_factor", 1 / 255))
    rgb = np.clip(np.rint(pixels), 0, 255).astype(np.uint8).transpose(1, 2, 0)
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def envelope(samples: np.ndarray, rate: int) -> dict:
    """A clip's waveform as the page draws it: the least and greatest sample of each of at most
    :data:`ENVELOPE_BINS` equal spans."""
    n = len(samples)
    bins = max(1, min(ENVELOPE_BINS, n))
    edges = np.linspace(0, n, bins + 1).astype(np.int64)
    low = np.minimum.reduceat(samples, edges[:-1]) if n else np.zeros(1)
    high = np.maximum.reduceat(samples, edges[:-1]) if n else np.zeros(1)
    return {
        "rate": rate,
        "seconds": round(n / rate, 6),
        "min": np.round(low.astype(np.float64), 5).tolist(),
        "max": np.round(high.astype(np.float64), 5).tolist(),
    }
