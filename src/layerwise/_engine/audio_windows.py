"""Long clips: cut at ``max_length`` frames, or read in overlapping windows of frames and stitched
back, each frame taken from the window in which it has the most context on both sides, as a long
text's tokens are (_inputs/windows.py: the same score, the same stitch).

A window of ``W`` frames starting at frame ``o`` runs the samples from ``o x stride`` on: as many as
``W`` frames need (``(W - 1) x stride + span``; Whisper: its 30 seconds). Window starts advance by
``step`` frames (half a window by default) and the last window ends at the clip's last frame, so
every frame of the clip is in some window, and a window's frame ``j`` is the clip's frame ``o + j``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._inputs.windows import Window


@dataclass(frozen=True)
class Piece:
    """What one forward reads of a clip: ``wave``, the samples; ``window``, where its frames go in
    the clip (None: they are the clip's frames, from the first on)."""

    clip: int
    wave: np.ndarray
    window: Window | None = None


def frame_windows(n_frames: int, size: int, step: int) -> list[Window]:
    """Windows of ``size`` frames over ``n_frames`` (``size`` < ``n_frames``), starts ``step``
    apart, the last ending at the last frame; each frame scored by its context on both sides."""
    starts = [*range(0, n_frames - size, step), n_frames - size]
    j = np.arange(size)
    scores = (np.minimum(j, size - 1 - j) + 0.01 * size).astype(np.float64)
    empty: tuple[int, ...] = ()  # a window of frames has no token ids: its positions and scores stitch it
    return [Window(ids=empty, type_ids=empty, positions=o + j, scores=scores) for o in starts]
