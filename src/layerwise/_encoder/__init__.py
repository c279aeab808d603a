"""The Encoder: a model and its tokenizer, ready to extract every layer (core.py), with its sentence
and word features (features.py); an image model's Encoder (media.py)."""

from __future__ import annotations

from .._settings.long_texts import LONG_TEXTS, LongTexts
from .core import MEDIA_ENCODERS, Encoder
from .loading import CPU_MAX_TOKENS, GPU_MAX_TOKENS
from .media import MediaEncoder

# Encoder(model) of an image model makes a MediaEncoder, which is an Encoder (isinstance holds)
Encoder.register(MediaEncoder)
MEDIA_ENCODERS["image"] = MediaEncoder  # type: ignore[assignment]

__all__ = ["CPU_MAX_TOKENS", "GPU_MAX_TOKENS", "LONG_TEXTS", "Encoder", "LongTexts", "MediaEncoder"]
