"""What one extraction call computes, as one frozen value from the API to the engine.

``Encoder.iter_extract`` and ``Encoder.iter_results`` check their keywords and settle them against
the model (layer indices resolved, the Encoder's method and final norm filled in) into a
:class:`Call`; the engine reads it whole, batch by batch. The server and the explorer build one for
their merged runs. Torch-free: the result dtype is a name here (the engine casts on the device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._settings.long_texts import LongTexts
from .._settings.settings import FinalNorm, Method
from ..errors import OptionError

if TYPE_CHECKING:
    from .._features.device_pool import DevicePlan


@dataclass(frozen=True)
class Call:
    """One call: the hidden states ``layers`` (indices, resolved), how they are collected
    (``method``, sub-layer ``taps``), long inputs (``long_texts``, ``stride``), the batching
    (``batch_size``, ``max_tokens``: None takes the engine's), a decoder's ``final_norm``, what is
    made on the model's device (``device_pool``: a sentence or word plan's pool, fusion and
    normalisation; None: the token states) and the results' ``dtype`` (float32 or float16, cast
    before anything crosses to the host)."""

    layers: tuple[int, ...]
    method: Method = "hidden_states"
    taps: tuple[str, ...] = ()
    long_texts: LongTexts = "truncate"
    stride: int | None = None
    batch_size: int | None = None
    max_tokens: int | None = None
    final_norm: FinalNorm = True
    device_pool: DevicePlan | None = None
    dtype: str = "float32"

    def check_batching(self) -> None:
        for name, value in (("batch_size", self.batch_size), ("max_tokens", self.max_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise OptionError(f"{name}={value!r} must be a whole number >= 1 (or None)")

    @property
    def sentence(self) -> bool:
        """Each input's result is one pooled row (a sentence plan made on the device)."""
        return self.device_pool is not None and self.device_pool.level == "sentence"
