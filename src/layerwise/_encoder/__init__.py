"""The Encoder: a model and its tokenizer, ready to extract every layer (core.py), with its sentence
and word features (features.py)."""

from __future__ import annotations

from .._settings.long_texts import LONG_TEXTS, LongTexts
from .core import Encoder
from .loading import CPU_MAX_TOKENS, GPU_MAX_TOKENS

__all__ = ["CPU_MAX_TOKENS", "GPU_MAX_TOKENS", "LONG_TEXTS", "Encoder", "LongTexts"]
