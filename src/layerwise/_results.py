"""What extraction returns: plain NumPy results, no torch.

    LayerStack      every requested hidden state of one input, with its tokens and alignment
    Units           what the units of an image or a sound are (a patch and its place, a frame
                    and its time), where a text's are tokens
    WordVectors     word-level vectors of one input (after subword pooling, maybe fused)
    SentenceVector  the pooled (maybe fused) vector of one input, with its truncation flag

Reading a store, analysing arrays and writing files import this module and NumPy only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .errors import LayerSpecError, OptionError


@dataclass(frozen=True, eq=False)
class Units:
    """What each unit of an image or a sound is, where a text's units are its tokens.

    ``kinds[i]`` is unit ``i``'s kind: ``cls``, ``distillation`` (DeiT), ``register`` (DINOv2 with
    registers) or ``patch`` for an image; ``frame`` for a sound. ``grid[i]`` is a patch's row and
    column on the model's input grid (-1, -1 for the units before the patches), ``grid_shape`` the
    grid's rows and columns; ``times[i]`` a frame's start and end in seconds. ``source`` names the
    input (its path, or ``<image 3>`` for one passed in memory)."""

    modality: str  # "image" or "audio"
    kinds: tuple[str, ...]
    source: str
    grid: np.ndarray | None = None  # (n_units, 2) int32: row, column
    grid_shape: tuple[int, int] | None = None
    times: np.ndarray | None = None  # (n_units, 2) float64: start, end in seconds

    def of(self, kind: str) -> np.ndarray:
        """The indices of the units of ``kind`` (``"patch"``: every patch, row by row)."""
        return np.flatnonzero(np.asarray(self.kinds) == kind)

    def during(self, start: float, end: float) -> np.ndarray:
        """The indices of a sound's frames that begin in ``[start, end)`` seconds: the mean of a time
        span is ``stack.hidden[:, stack.units.during(1.0, 2.5)].mean(axis=1)``."""
        if self.times is None:
            raise OptionError(f"an {self.modality}'s units have no times; frames of sound have")
        if not end > start:
            raise OptionError(f"the span [{start}, {end}) is empty: end must be after start")
        begins = self.times[:, 0]
        return np.flatnonzero((begins >= start) & (begins < end))


# how a unit before an image's patches is named in ``LayerStack.tokens`` (a patch: ``r{row}c{col}``)
UNIT_NAMES = {"cls": "[CLS]", "distillation": "[DIST]", "register": "[REG]"}


def units_from_names(tokens: tuple[str, ...], source: str, meta: Mapping) -> Units | None:
    """An image's or a sound's units from what a store or a file keeps: each unit's name (``[CLS]``,
    ``r3c5``) and the run's metadata (its ``modality``; a frame's ``frame_seconds``: stride and span).
    None for a text's tokens."""
    modality = meta.get("modality")
    n = len(tokens)
    if modality == "audio":
        stride, span = meta["frame_seconds"]
        starts = np.arange(n, dtype=np.float64) * stride
        return Units("audio", ("frame",) * n, source, times=np.stack([starts, starts + span], axis=1))
    if modality != "image":
        return None
    kind_of = {name: kind for kind, name in UNIT_NAMES.items()}
    kinds = tuple(kind_of.get(token, "patch") for token in tokens)
    grid = np.full((n, 2), -1, dtype=np.int32)
    for i, (token, kind) in enumerate(zip(tokens, kinds, strict=True)):
        if kind == "patch":
            row, _, col = token[1:].partition("c")
            grid[i] = int(row), int(col)
    shape = (int(grid[:, 0].max()) + 1, int(grid[:, 1].max()) + 1) if "patch" in kinds else None
    return Units("image", kinds, source, grid, shape)


@dataclass(frozen=True, eq=False)
class LayerStack:
    """Every requested hidden state of one input.

    ``hidden[k]`` is hidden state ``layers[k]`` (0 = embedding output, i = output of layer i),
    shape ``(n_layers, n_tokens, hidden_size)``, float32 (float16 when ``extract(dtype="float16")``
    asked for it). Token-level fields have one entry per
    wordpiece including ``[CLS]``/``[SEP]``: ``offsets`` are character spans into ``text``
    (into ``text_pair`` where ``segment_ids`` is 1; ``(0, 0)`` for special tokens), ``word_ids``
    index the words of the segment (-1 for special tokens). ``taps`` holds sub-layer outputs for
    ``tap_layers`` when they were asked for. ``truncated`` says the input was cut to the model's
    maximum (``words_lost`` words fell off); ``n_windows`` > 1 says it was stitched from windows.

    An image's or a sound's stack has ``units`` (:class:`Units`: each unit's kind, a patch's row and
    column, a frame's times); its ``tokens`` name the units (``[CLS]``, ``r0c3``), its content units
    (patches, frames) count as words (``word_ids`` their number, -1 for ``[CLS]`` and registers), so
    that ``special_tokens="exclude"`` pools over the patches alone, and ``text`` names the input."""

    hidden: np.ndarray
    layers: tuple[int, ...]
    tokens: tuple[str, ...]
    offsets: np.ndarray
    word_ids: np.ndarray
    segment_ids: np.ndarray
    text: str
    text_pair: str | None = None
    words: tuple[str, ...] | None = None
    truncated: bool = False
    words_lost: int = 0
    words_empty: tuple[int, ...] = ()  # pre-split words that produced no token
    n_windows: int = 1
    taps: Mapping[str, np.ndarray] = field(default_factory=dict)
    tap_layers: tuple[int, ...] = ()
    # a sentence or word plan's result, computed where the states were (features/device_pool.py):
    # pooled, then fused and normalised as the plan says: (n_layers, dim) per sentence, (n_layers,
    # n_words, dim) for words, with n_layers 1 when fused. The token states then stayed there, and
    # ``hidden`` is (n_layers, n_tokens, 0). Only ``Encoder.iter_results`` makes such stacks.
    pooled: np.ndarray | None = None
    units: Units | None = None  # an image's or a sound's units; None for a text's tokens

    @property
    def modality(self) -> str:
        """``"text"``, ``"image"`` or ``"audio"``: what the input was."""
        return "text" if self.units is None else self.units.modality

    @property
    def n_tokens(self) -> int:
        return self.hidden.shape[1]

    @property
    def empty(self) -> bool:
        """No token but special ones: an empty line, and one the tokenizer reads as nothing (NUL
        bytes, a zero-width space), count alike in a run's "(N empty)"."""
        return not bool((self.word_ids >= 0).any())

    @property
    def n_held(self) -> int:
        """How many hidden states this result holds (``len(layers)``); the model's own counts are
        ``Encoder.n_layers`` (encoder layers) and ``Encoder.n_hidden_states`` (layers + embeddings)."""
        return self.hidden.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.hidden.shape[2]

    def layer(self, index: int) -> np.ndarray:
        """Hidden state ``index`` (a model index, as in ``layers``) as ``(n_tokens, hidden_size)``."""
        if index not in self.layers:
            raise LayerSpecError(f"hidden state {index} was not extracted; this result holds {self.layers}")
        return self.hidden[self.layers.index(index)]

    def segment_text(self, segment: int) -> str:
        """The text that ``offsets`` of tokens in ``segment`` point into: ``text_pair`` for segment 1
        of a pair, else ``text``."""
        return self.text_pair if segment == 1 and self.text_pair is not None else self.text

    def __repr__(self) -> str:
        text = self.text if len(self.text) <= 40 else self.text[:37] + "..."
        notes = ", truncated" if self.truncated else ""
        notes += f", n_windows={self.n_windows}" if self.n_windows > 1 else ""
        return (
            f"LayerStack(text={text!r}, layers={self.layers}, n_tokens={self.n_tokens}, "
            f"hidden_size={self.hidden_size}{notes})"
        )


@dataclass(frozen=True, eq=False)
class WordVectors:
    """Word-level features of one input.

    ``vectors`` is ``(n_layers, n_words, dim)`` (``dim`` = 2 x hidden for ``first_last``), or
    ``(n_words, dim)`` after a fusion. ``words[j]`` is word ``j`` as it appears in the text (the
    caller's word for pre-split input), ``spans[j]`` its character span in ``text`` (in
    ``text_pair`` where ``segment_ids[j]`` is 1), ``n_subwords[j]`` its wordpiece count. Words
    of a pair come segment by segment. ``words_lost`` counts words cut off by truncation: they are
    absent, never replaced by another word's vector."""

    vectors: np.ndarray
    layers: tuple[int, ...]
    words: tuple[str, ...]
    spans: np.ndarray
    segment_ids: np.ndarray
    n_subwords: np.ndarray
    text: str
    text_pair: str | None = None
    words_lost: int = 0
    fuse: str | None = None  # the fusion of ``layers`` that ``vectors`` holds, if any
    words_empty: tuple[int, ...] = ()  # input words that produced no token: zero vectors

    @property
    def n_words(self) -> int:
        return len(self.words)

    def __repr__(self) -> str:
        return (
            f"WordVectors(n_words={self.n_words}, vectors={self.vectors.shape}, layers={self.layers}"
            + (f", words_lost={self.words_lost}" if self.words_lost else "")
            + ")"
        )


@dataclass(frozen=True, eq=False)
class SentenceVector:
    """The pooled (and possibly fused) vector of one input, with its truncation flag."""

    vector: np.ndarray
    truncated: bool = False


FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65,504


def check_float16(values: np.ndarray, where: str, layers: tuple[int, ...] = ()) -> None:
    """Refuse ``values`` bound for float16 when a finite one lies past float16's range: it would be
    stored as inf, a wrong number read back as if measured. (Decoders' residual streams grow with
    depth: Gemma 3 270M's pass 100,000 from hidden state 9 on.) ``layers``: the hidden states along
    ``values``' first axis (none for a fused result), to name the first that overflows."""
    if values.size == 0 or values.dtype == np.float16:
        return
    peak = max(float(values.max()), -float(values.min()))
    if not FLOAT16_MAX < peak < np.inf:  # NaN and inf are the NaN check's to report
        return
    if layers and values.shape[0] == len(layers):
        peaks = np.abs(values.reshape(len(layers), -1)).max(axis=1)
        where = f"hidden state {layers[int(np.argmax(peaks > FLOAT16_MAX))]} of {where}"
    raise float16_overflow(f"{where} holds {peak:,.0f}")


def float16_overflow(what: str) -> OptionError:
    """The error for values past float16's range; ``what`` says where and how large."""
    return OptionError(
        f"{what}, past float16's largest value ({FLOAT16_MAX:,.0f}): stored as float16 it would read "
        "back as inf. Write float32 (--dtype float32, dtype='float32'), or leave out the hidden states "
        "that large"
    )


def to_dtype(
    values: np.ndarray, dtype: str | np.dtype, where: str, layers: tuple[int, ...] = ()
) -> np.ndarray:
    """``values`` as ``dtype``: the one NumPy cast of an output's numbers, so that none reaches
    float16 without :func:`check_float16` (``where``, ``layers``: what its error names)."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        check_float16(values, where, layers)
    return values.astype(dtype, copy=False)


def check_float16_rows(values: np.ndarray, names: list[str], layers: tuple[int, ...] = ()) -> None:
    """:func:`check_float16` on a batch whose first axis holds one item each (an input, a context),
    named by ``names``: the batch is checked at once, and only one past the range is looked at item
    by item, so that the error names the first item that overflows."""
    try:
        check_float16(values, "a batch")
    except OptionError:
        for value, name in zip(values, names, strict=True):
            check_float16(value, name, layers)
        raise


def layers_along(stack: LayerStack, fuse: str | None) -> tuple[int, ...]:
    """The hidden states along the first axis of a result of ``stack``: its layers, or none when
    a fusion made one vector of them."""
    return stack.layers if fuse is None else ()


def result_values(result: LayerStack | WordVectors | SentenceVector) -> np.ndarray:
    """The numbers a result holds: its states, word vectors or sentence vector."""
    if isinstance(result, LayerStack):
        return result.hidden if result.pooled is None else result.pooled
    return result.vectors if isinstance(result, WordVectors) else result.vector
