"""Sound in: files (WAV, FLAC, MP3, OGG), folders, globs, bytes and arrays, decoded by soundfile
(libsndfile) to mono float32 and resampled to the model's rate by SciPy's polyphase resampler.

    audio_files(["clips/", "talks/*.flac"])     # the files they name, in order
    open_audio("talk.flac", 0, 16000)           # (mono float32 at 16 kHz, "talk.flac")

A model's own feature extractor (``AutoFeatureExtractor``: normalisation, log-mel spectrograms) then
prepares the waveform (_model/loading/media.py); nothing here changes a sample beyond the decode,
the mix to mono and the resample.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from .._settings.extras import require
from ..errors import InputError
from .images import media_files

AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".oga", ".opus", ".aiff", ".aif")


def audio_files(sources: Iterable[str | os.PathLike]) -> list[str]:
    """The audio files ``sources`` name: a file as it is, a folder's audio files (sorted), a
    glob's matches (sorted); a source that names none is an error naming it."""
    return media_files(sources, AUDIO_SUFFIXES, "audio file")


def open_audio(item: Any, index: int, rate: int) -> tuple[np.ndarray, str]:
    """``item`` as a mono float32 waveform at ``rate`` Hz, and the name its results carry: a path,
    encoded bytes, a 1-D array already at ``rate``, or a pair ``(array, its rate)`` (an array of
    shape (samples, channels) is mixed to mono)."""
    if isinstance(item, str | os.PathLike):
        name = os.fspath(item)
        if not os.path.isfile(name):
            raise InputError(f"audio file {name!r} does not exist; check the path")
        samples, given = _decode(name, name)
        return resample(samples, given, rate, name), name
    name = f"<audio {index}>"
    if isinstance(item, bytes | bytearray | memoryview):
        samples, given = _decode(io.BytesIO(bytes(item)), name)
        return resample(samples, given, rate, name), name
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], np.ndarray):
        array, given = item
        if isinstance(given, bool) or not isinstance(given, int) or given <= 0:
            raise InputError(f"{name}: its rate {given!r} must be a positive int (samples per second)")
        return resample(_mono(array, name), given, rate, name), name
    if isinstance(item, np.ndarray):
        return _mono(item, name), name
    raise InputError(
        f"{name} is a {type(item).__name__}; a speech model takes audio paths, bytes, 1-D arrays at "
        f"its rate ({rate} Hz) or (array, rate) pairs"
    )


def resample(samples: np.ndarray, given: int, rate: int, name: str) -> np.ndarray:
    """``samples`` at ``given`` Hz resampled to ``rate`` Hz: SciPy's polyphase filter
    (``resample_poly``, a Kaiser-windowed low-pass: what torchaudio and librosa's "polyphase" do)."""
    if given == rate:
        return samples
    require("audio", "resampling")
    from scipy.signal import resample_poly

    step = math.gcd(given, rate)
    out = resample_poly(samples.astype(np.float64), rate // step, given // step)
    if not len(out):
        raise InputError(f"{name}: too short to resample from {given} to {rate} Hz")
    return out.astype(np.float32)


def _decode(source: Any, name: str) -> tuple[np.ndarray, int]:
    require("audio", "audio files")
    import soundfile

    try:
        samples, given = soundfile.read(source, dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise InputError(f"{name}: cannot be decoded as audio ({exc}); pass WAV, FLAC, MP3 or OGG") from exc
    return _mono(samples, name), int(given)


def _mono(array: np.ndarray, name: str) -> np.ndarray:
    if array.ndim == 2:
        array = array.mean(axis=1)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.number):
        raise InputError(f"{name}: an array of shape {array.shape}; pass (samples,) or (samples, channels)")
    if not len(array):
        raise InputError(f"{name}: no samples")
    values = array.astype(np.float32)
    if not np.isfinite(values).all():
        raise InputError(f"{name}: its samples hold NaN or inf")
    return values
