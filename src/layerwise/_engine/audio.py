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
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .._inputs.audio import open_audio
from .._inputs.windows import stitch
from .._model.loading.media import LoadedMedia
from .._results import LayerStack, Units, check_float16
from .audio_windows import Piece, frame_windows
from .media import prepared_batches, unit_stack
from .rows import nonfinite_error, warn_nonfinite

logger = logging.getLogger("layerwise")
# the families whose padded, masked batches give each clip its numbers alone (tests/test_media_audio.py);
# data2vec-audio's positional convolutions see the padding (its clips differ by whole units): alone
PADDED = ("wav2vec2", "hubert", "wavlm")


class AudioRun:
    """How one speech encoder runs: ``loaded`` (model, feature extractor, family), ``batch_size``
    clips at a time where they may share a batch, NaN refused unless ``allow_nan``."""

    def __init__(self, loaded: LoadedMedia, batch_size: int, allow_nan: bool, max_length: int | None) -> None:
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
        # the most frames one forward reads: Whisper's window; max_length for the others (None: whole)
        self.limit = self.max_frames if self.whisper else max_length
        self.max_units = self.limit or 0  # 0: no limit (a clip is read whole)
        masked = bool(getattr(processor, "return_attention_mask", False))
        norm = getattr(config, "feat_extract_norm", None)
        self.shared = self.whisper or (config.model_type in PADDED and norm == "layer" and masked)

    @property
    def frame_seconds(self) -> list[float]:
        """A frame's stride and span, in seconds (every output's metadata records them)."""
        return [self.stride / self.loaded.rate, self.span / self.loaded.rate]

    def prepare(self, items: Sequence[Any], first: int) -> list[tuple[np.ndarray, str]]:
        """``items`` (input ``first`` on) decoded, mixed to mono and resampled to the model's rate."""
        return [open_audio(item, first + k, self.loaded.rate) for k, item in enumerate(items)]

    def stacks(
        self,
        items: Sequence[Any],
        layers: tuple[int, ...],
        dtype: str,
        batch_size: int | None = None,
        *,
        window: bool = False,
        step: int | None = None,
    ) -> Iterator[tuple[int, LayerStack]]:
        """``(input index, LayerStack of layers)`` for ``items``, a batch at a time; the first batch
        is decoded before this returns, so that a bad first input fails at the call. A clip longer
        than the frames one forward reads is cut there, or with ``window`` read in windows whose
        starts are ``step`` frames apart (audio_windows.py)."""
        size = batch_size or self.batch_size
        batches = prepared_batches(items, size, self.prepare)
        return iter(()) if batches is None else self._run(batches, layers, dtype, size, (window, step))

    def _run(
        self, batches: Any, layers: tuple[int, ...], dtype: str, size: int, windows: tuple[bool, int | None]
    ) -> Iterator[tuple[int, LayerStack]]:
        flagged: list[int] = []
        cut: list[str] = []
        for lo, clips in batches:
            pieces, truncated = self.pieces(clips, *windows)
            ran: dict[int, list[tuple[Piece, np.ndarray]]] = {}
            for group in self.groups(pieces, size):
                states = self.forward([piece.wave for piece in group], layers)
                for piece, hidden in zip(group, states, strict=True):
                    ran.setdefault(piece.clip, []).append((piece, hidden))
            for place, (_, name) in enumerate(clips):
                hidden = _joined(ran[place])
                if not np.isfinite(hidden).all():
                    if not self.allow_nan:
                        raise nonfinite_error(lo + place, name, hidden, layers)
                    flagged.append(lo + place)
                if place in truncated:
                    cut.append(name)
                yield lo + place, self.stack(name, hidden, layers, dtype, place in truncated)
        if flagged:
            warn_nonfinite(flagged)
        if cut:
            assert self.limit is not None
            logger.warning(
                "%d clip(s) are longer than %d frames (%.1f s), the most one forward reads here (%s), "
                "and were cut there (first: %s); their stacks say truncated. long_texts='window' reads "
                "every frame",
                len(cut),
                self.limit,
                self.limit * self.frame_seconds[0],
                "Whisper's window" if self.whisper else "max_length",
                cut[0],
            )

    def n_frames(self, samples: int) -> int:
        """The frames a clip of ``samples`` holds (Whisper: of the audio given, past its window too)."""
        if self.whisper:
            return math.ceil(samples / self.stride)
        return int(self.loaded.model._get_feat_extract_output_lengths(samples))

    def samples_for(self, frames: int) -> int:
        """The samples a forward of ``frames`` frames reads (Whisper: its whole window)."""
        return frames * self.stride if self.whisper else (frames - 1) * self.stride + self.span

    def pieces(
        self, clips: list[tuple[np.ndarray, str]], window: bool, step: int | None
    ) -> tuple[list[Piece], set[int]]:
        """What the forwards of a batch read: each clip whole, cut at the limit (its place in the set
        returned), or in windows of the limit's frames."""
        pieces: list[Piece] = []
        truncated: set[int] = set()
        for place, (wave, _) in enumerate(clips):
            n = self.n_frames(len(wave))
            if self.limit is None or n <= self.limit:
                pieces.append(Piece(place, wave))
            elif not window:
                truncated.add(place)  # Whisper's extractor cuts at its window itself
                pieces.append(Piece(place, wave if self.whisper else wave[: self.samples_for(self.limit)]))
            else:
                for frames in frame_windows(n, self.limit, step or max(1, self.limit // 2)):
                    begin = int(frames.positions[0]) * self.stride
                    pieces.append(Piece(place, wave[begin : begin + self.samples_for(self.limit)], frames))
        return pieces, truncated

    def groups(self, pieces: list[Piece], size: int) -> list[list[Piece]]:
        """The pieces that run together, ``size`` at most: any where padding leaves each piece's
        numbers as they are alone; else those of one length (no padding at all)."""
        by_length: dict[int, list[Piece]] = {}
        for piece in pieces:
            by_length.setdefault(0 if self.shared else len(piece.wave), []).append(piece)
        return [same[k : k + size] for same in by_length.values() for k in range(0, len(same), size)]

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
        self, name: str, hidden: np.ndarray, layers: tuple[int, ...], dtype: str, truncated: bool
    ) -> LayerStack:
        """One clip's LayerStack of its ``hidden`` states, in ``dtype``."""
        if dtype == "float16":
            check_float16(hidden, name, layers)
            hidden = hidden.astype(np.float16)
        stack = unit_stack(hidden, layers, self.units(hidden.shape[1]), name)
        return dataclasses.replace(stack, truncated=True) if truncated else stack

    def units(self, n_frames: int) -> Units:
        """The frames of a clip: frame ``i`` starts at ``i * stride`` samples and sees ``span``."""
        rate = self.loaded.rate
        starts = np.arange(n_frames, dtype=np.float64) * self.stride / rate
        times = np.stack([starts, starts + self.span / rate], axis=1)
        return Units("audio", ("frame",) * n_frames, "", times=times)


def _joined(parts: list[tuple[Piece, np.ndarray]]) -> np.ndarray:
    """A clip's states from its pieces: the one piece's, or its windows' stitched by best context."""
    if parts[0][0].window is None:
        return parts[0][1]
    windows = [piece.window for piece, _ in parts]
    n_frames = int(windows[-1].positions[-1]) + 1  # type: ignore[union-attr]
    return stitch([hidden for _, hidden in parts], windows, n_frames, token_axis=1)  # type: ignore[arg-type]
