"""The forward of a speech encoder: clips decoded and resampled, prepared by the model's own feature
extractor beside the forward, transformers' ``output_hidden_states``, one LayerStack per clip whose
units are its frames, each with its start and end in seconds.

A frame stands for ``stride`` samples of time (the product of the convolutions' strides: 320 at
16 kHz, 20 ms) and sees ``span`` samples (wav2vec2's receptive field, 400: 25 ms; Whisper's frame is
given its 20 ms). How clips share a batch follows what gives each clip's own numbers:

- **Whisper** reads a fixed 30-second window (its feature extractor pads every clip to it, and the
  encoder's positions are learned for it): clips batch as they are, and each keeps the frames of
  the audio it was given (``ceil(samples / 320)``), not the padding's. A clip longer than 30 s is
  cut there (``truncated``).
- **wav2vec2, HuBERT, WavLM, data2vec-audio** whose feature encoder normalises each frame alone
  (``feat_extract_norm="layer"``) and whose extractor gives an attention mask batch padded clips:
  the padded frames are zeroed and masked, which leaves each clip's frames as they are alone. A
  model whose first convolution is group-normalised over time (wav2vec2-base,
  ``feat_extract_norm="group"``) would see the padding, and so would data2vec-audio's positional
  convolutions: their clips share a batch only with clips of their own length (no padding).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .._inputs.ahead import ahead
from .._inputs.audio import open_audio
from .._model.loading.media import LoadedMedia
from .._results import LayerStack, Units, check_float16
from .media import unit_stack
from .rows import nonfinite_error, warn_nonfinite

logger = logging.getLogger("layerwise")
# the families whose padded, masked batches give each clip its numbers alone (tests/test_media_audio.py);
# data2vec-audio's positional convolutions see the padding (its clips differ by whole units): alone
PADDED = ("wav2vec2", "hubert", "wavlm")


class AudioRun:
    """How one speech encoder runs: ``loaded`` (model, feature extractor, family), ``batch_size``
    clips at a time where they may share a batch, NaN refused unless ``allow_nan``."""

    def __init__(self, loaded: LoadedMedia, batch_size: int, allow_nan: bool) -> None:
        self.loaded, self.batch_size, self.allow_nan = loaded, batch_size, allow_nan
        config, processor = loaded.config, loaded.processor
        self.whisper = config.model_type == "whisper"
        if self.whisper:
            self.stride = 2 * int(processor.hop_length)  # two mel hops per frame (conv2: stride 2)
            self.span = self.stride
            self.max_frames: int | None = int(processor.nb_max_frames) // 2
        else:
            self.stride = math.prod(config.conv_stride)
            span = 1
            for kernel, step in zip(config.conv_kernel[::-1], config.conv_stride[::-1], strict=True):
                span = (span - 1) * step + kernel
            self.span, self.max_frames = span, None
        self.max_units = self.max_frames or 0  # 0: no limit (a clip is read whole)
        masked = bool(getattr(processor, "return_attention_mask", False))
        norm = getattr(config, "feat_extract_norm", None)
        self.shared = self.whisper or (config.model_type in PADDED and norm == "layer" and masked)

    @property
    def seconds_per_frame(self) -> float:
        return self.stride / self.loaded.rate

    def prepare(self, items: Sequence[Any], first: int) -> list[tuple[np.ndarray, str]]:
        """``items`` (input ``first`` on) decoded, mixed to mono and resampled to the model's rate."""
        return [open_audio(item, first + k, self.loaded.rate) for k, item in enumerate(items)]

    def stacks(
        self, items: Sequence[Any], layers: tuple[int, ...], dtype: str, batch_size: int | None = None
    ) -> Iterator[tuple[int, LayerStack]]:
        """``(input index, LayerStack of layers)`` for ``items``, as batches finish (a batch's clips of
        one length together); the first batch is decoded before this returns, so that a bad first
        input fails at the call."""
        size = batch_size or self.batch_size
        starts = list(range(0, len(items), size))
        if not starts:
            return iter(())
        stream = ahead(starts, lambda lo: self.prepare(items[lo : lo + size], lo))
        first = next(stream)  # the second batch is decoded on a thread meanwhile (inputs/ahead.py)
        return self._run(itertools.chain([first], stream), layers, dtype)

    def _run(self, batches: Any, layers: tuple[int, ...], dtype: str) -> Iterator[tuple[int, LayerStack]]:
        flagged: list[int] = []
        cut: list[str] = []
        for lo, clips in batches:
            for group in self.groups(clips):
                states = self.forward([clips[k][0] for k in group], layers)
                for place, hidden in zip(group, states, strict=True):
                    wave, name = clips[place]
                    if not np.isfinite(hidden).all():
                        if not self.allow_nan:
                            raise nonfinite_error(lo + place, name, hidden, layers)
                        flagged.append(lo + place)
                    stack = self.stack(wave, name, hidden, layers, dtype)
                    if stack.truncated:
                        cut.append(name)
                    yield lo + place, stack
        if flagged:
            warn_nonfinite(flagged)
        if cut:
            logger.warning(
                "%d clip(s) are longer than Whisper's 30-second window and were cut there (first: %s); "
                "their stacks say truncated",
                len(cut),
                cut[0],
            )

    def groups(self, clips: list[tuple[np.ndarray, str]]) -> list[list[int]]:
        """The clips of a batch (their places in it) that run together: all of them where padding
        leaves each clip's numbers as they are; else those of one length (no padding at all)."""
        if self.shared:
            return [list(range(len(clips)))]
        by_length: dict[int, list[int]] = {}
        for k, (wave, _) in enumerate(clips):
            by_length.setdefault(len(wave), []).append(k)
        return list(by_length.values())

    @torch.inference_mode()
    def forward(self, waves: list[np.ndarray], layers: tuple[int, ...]) -> list[np.ndarray]:
        """The hidden states ``layers`` of each clip of one batch, ``(layers, frames, hidden)`` as
        float32 on the host, each cut to the clip's own frames."""
        loaded = self.loaded
        model, extractor, rate = loaded.model, loaded.processor, loaded.rate
        if self.whisper:
            features = extractor(waves, sampling_rate=rate, return_tensors="pt")["input_features"]
            out = model(features.to(loaded.device, loaded.dtype), output_hidden_states=True)
            lengths = [min(self.max_frames or 0, math.ceil(len(w) / self.stride)) for w in waves]
        else:
            padded = len({len(w) for w in waves}) > 1
            given = extractor(
                waves, sampling_rate=rate, return_tensors="pt", padding=padded, return_attention_mask=padded
            )
            mask = given.get("attention_mask") if padded else None
            values = given["input_values"].to(loaded.device, loaded.dtype)
            out = model(
                values,
                attention_mask=None if mask is None else mask.to(loaded.device),
                output_hidden_states=True,
            )
            lengths = [int(model._get_feat_extract_output_lengths(len(w))) for w in waves]
        states = torch.stack([out.hidden_states[i] for i in layers], dim=1).float().cpu().numpy()
        return [states[k, :, :n] for k, n in enumerate(lengths)]

    def stack(
        self, wave: np.ndarray, name: str, hidden: np.ndarray, layers: tuple[int, ...], dtype: str
    ) -> LayerStack:
        """One clip's LayerStack of its ``hidden`` states, in ``dtype``; cut at Whisper's window
        where it was longer."""
        if dtype == "float16":
            check_float16(hidden, name, layers)
            hidden = hidden.astype(np.float16)
        stack = unit_stack(hidden, layers, self.units(hidden.shape[1]), name)
        if self.max_frames is not None and len(wave) > self.max_frames * self.stride:
            return dataclasses.replace(stack, truncated=True)
        return stack

    def units(self, n_frames: int) -> Units:
        """The frames of a clip: frame ``i`` starts at ``i * stride`` samples and sees ``span``."""
        rate = self.loaded.rate
        starts = np.arange(n_frames, dtype=np.float64) * self.stride / rate
        times = np.stack([starts, starts + self.span / rate], axis=1)
        return Units("audio", ("frame",) * n_frames, "", times=times)
