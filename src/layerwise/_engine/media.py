"""The forward of an image model: batches of inputs decoded and preprocessed by the model's own
processor beside the forward, transformers' ``output_hidden_states``, one LayerStack per input.

Images preprocessed by the processor all have its size, so a batch is ``batch_size`` inputs (no
length sort, no padding). The next batch is decoded and preprocessed on a thread while this one runs
(Pillow's decode and resize release the GIL), as a text's next block is tokenised. The model runs
on its own module objects, called with ``output_hidden_states=True``: nothing is set on it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .._inputs.ahead import ahead
from .._inputs.images import open_image
from .._model.loading.media import LoadedMedia
from .._results import UNIT_NAMES, LayerStack, Units, check_float16_rows
from .rows import nonfinite_error, warn_nonfinite


class MediaRun:
    """How one image model runs: ``loaded`` (model, processor, family), ``batch_size`` inputs at a
    time, NaN refused unless ``allow_nan``."""

    def __init__(self, loaded: LoadedMedia, batch_size: int, allow_nan: bool) -> None:
        self.loaded, self.batch_size, self.allow_nan = loaded, batch_size, allow_nan
        patch = loaded.config.patch_size
        self.patch = (patch, patch) if isinstance(patch, int) else tuple(patch)
        size = loaded.config.image_size
        rows, cols = (size, size) if isinstance(size, int) else size
        prefix = loaded.family.prefix_of(loaded.config)
        self.max_units = len(prefix) + (rows // self.patch[0]) * (cols // self.patch[1])  # at its own size

    def prepare(self, items: Sequence[Any], first: int) -> tuple[torch.Tensor, list[str]]:
        """``items`` (input ``first`` on) decoded and preprocessed: the batch's pixel values and the
        names its results carry."""
        opened = [open_image(item, first + k) for k, item in enumerate(items)]
        pixels = self.loaded.processor(images=[image for image, _ in opened], return_tensors="pt")
        return pixels["pixel_values"], [name for _, name in opened]

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
        """``(input index, LayerStack of layers)`` for ``items``, in input order. The first batch is
        decoded before this returns, so that a bad first input fails at the call. An image is read
        whole: ``window`` and ``step`` change nothing for it."""
        batches = prepared_batches(items, batch_size or self.batch_size, self.prepare)
        return iter(()) if batches is None else self._run(batches, layers, dtype)

    def _run(self, batches: Any, layers: tuple[int, ...], dtype: str) -> Iterator[tuple[int, LayerStack]]:
        flagged: list[int] = []
        for lo, (pixels, names) in batches:
            hidden = self.forward(pixels, layers, dtype)  # (B, L, N, H) on the host
            units = self.units(pixels.shape[-2:], hidden.shape[2])
            for k, name in enumerate(names):
                if not np.isfinite(hidden[k]).all():
                    if not self.allow_nan:
                        raise nonfinite_error(lo + k, name, hidden[k], layers)
                    flagged.append(lo + k)
                yield lo + k, unit_stack(hidden[k], layers, units, name)
        if flagged:
            warn_nonfinite(flagged)

    @torch.inference_mode()
    def forward(self, pixels: torch.Tensor, layers: tuple[int, ...], dtype: str) -> np.ndarray:
        """The hidden states ``layers`` of one batch: ``(batch, layers, units, hidden)``, on the host
        in ``dtype``."""
        loaded = self.loaded
        out = loaded.model(pixel_values=pixels.to(loaded.device, loaded.dtype), output_hidden_states=True)
        states = torch.stack([out.hidden_states[i] for i in layers], dim=1)
        host = states.float().cpu().numpy()
        if dtype == "float16":
            check_float16_rows(host, [f"input {k}" for k in range(len(host))], layers)
        return host if dtype == "float32" else host.astype(np.float16)

    def units(self, size: Sequence[int], n_units: int) -> Units:
        """The units of an input of ``size`` (height, width in pixels) with ``n_units`` units: the
        family's units before the patches, then the patches row by row."""
        rows, cols = int(size[0]) // self.patch[0], int(size[1]) // self.patch[1]
        prefix = self.loaded.family.prefix_of(self.loaded.config)
        if len(prefix) + rows * cols != n_units:
            raise RuntimeError(  # a model whose layout the family table does not describe
                f"{self.loaded.config.model_type}: {n_units} units, but {len(prefix)} before the patches "
                f"and a {rows} x {cols} grid of patches: the family table (families/media.py) is wrong"
            )
        grid = np.full((n_units, 2), -1, dtype=np.int32)
        grid[len(prefix) :, 0] = np.repeat(np.arange(rows), cols)
        grid[len(prefix) :, 1] = np.tile(np.arange(cols), rows)
        kinds = (*prefix, *("patch",) * (rows * cols))
        return Units("image", kinds, "", grid, (rows, cols))


def prepared_batches(
    items: Sequence[Any], size: int, prepare: Callable[[Sequence[Any], int], Any]
) -> Iterator[tuple[int, Any]] | None:
    """``(first index, prepare(its items, first index))`` for each batch of ``size`` items; None for
    no items. The first batch is prepared now, so that a bad first input fails at the call; drawing
    it starts the second's preparation on a thread (_inputs/ahead.py), and so on."""
    starts = list(range(0, len(items), size))
    if not starts:
        return None
    stream = ahead(starts, lambda lo: prepare(items[lo : lo + size], lo))
    first = next(stream)
    return itertools.chain([first], stream)


def unit_stack(hidden: np.ndarray, layers: tuple[int, ...], units: Units, name: str) -> LayerStack:
    """One input's LayerStack: its states ``(L, n_units, H)``, its units named (``[CLS]``,
    ``r2c5``) and numbered as words (content units: their number; the others -1)."""
    content = np.asarray([kind in ("patch", "frame") for kind in units.kinds])
    word_ids = np.where(content, np.cumsum(content) - 1, -1).astype(np.int32)
    if units.grid is not None:
        places = zip(units.kinds, units.grid.tolist(), strict=True)
        tokens = tuple(UNIT_NAMES.get(kind, f"r{row}c{col}") for kind, (row, col) in places)
    else:
        tokens = tuple(f"{start:.2f}s" for start in (units.times[:, 0] if units.times is not None else ()))
    n = len(units.kinds)
    return LayerStack(
        hidden=hidden,
        layers=layers,
        tokens=tokens,
        offsets=np.zeros((n, 2), dtype=np.int32),
        word_ids=word_ids,
        segment_ids=np.zeros(n, dtype=np.int8),
        text=name,
        units=Units(units.modality, units.kinds, name, units.grid, units.grid_shape, units.times),
    )
