"""Sliding windows for inputs longer than the model's maximum length.

An input of N tokens that does not fit is cut into overlapping windows, each wrapped in the
model's special tokens (``[CLS] ... [SEP]``) and run like any other input. Window starts advance
by ``stride`` tokens (BERT's ``doc_stride``); the last window ends at the last token. Each token's
vector, at every layer, is taken from the window in which it has the most context on both sides,
as in google-research/bert ``run_squad.py`` (``_check_is_max_context``; recommended for feature
extraction in google-research/bert issue 66)::

    score(window, token) = min(tokens to its left, tokens to its right) + 0.01 * window length

The first window with the highest score wins. Special tokens come from the first window
(leading ones) and the last window (the final ``[SEP]``).

A causal model (a decoder LM) has no right context to gain: a token's vector depends on the tokens
before it in its window only. There each token is taken from the window in which it has the most
left context, the first window that holds it (``score = tokens to its left``); the tokens of the
first window then equal those of one unwindowed forward exactly.

Sentence pairs keep the whole first segment in every window and slide over the second (the SQuAD
layout: question + document span); the first segment's vectors come from the first window. A pair
whose first segment leaves no room for the second cannot be windowed and is reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError, InputTooLargeError, OptionError
from .block import EncodedInput


def check_window_options(long_texts: str, stride: int | None, max_length: int) -> None:
    """Validate ``stride`` before any work: it applies to windows only, and a window of
    ``max_length`` tokens holds at most ``max_length - 2`` content tokens ([CLS] and [SEP] aside)."""
    if stride is None:
        return
    if isinstance(stride, bool) or not isinstance(stride, int):
        raise OptionError(f"stride={stride!r} must be a whole number of tokens")
    if long_texts != "window":
        raise OptionError(
            f"stride={stride} applies to sliding windows only; pass long_texts='window' too or drop stride"
        )
    room = max_length - 2
    if not 1 <= stride <= room:
        raise OptionError(
            f"stride={stride} must be between 1 and {room}, the content length of a {max_length}-token window"
        )


WINDOW_MEMORY = 2 * 2**30  # bytes of hidden states one windowed input may hold


def check_window_memory(raw, n_layers: int, hidden_size: int) -> None:
    """Window mode holds every hidden state of an input until its windows are stitched; refuse,
    before tokenising, an input that would need more than WINDOW_MEMORY bytes for that: a text
    counted at one token per 4 characters (a low estimate for English WordPiece), pre-split words at
    one token per word (each word that is not empty gives one token or more)."""
    bytes_per_token = n_layers * hidden_size * 4
    max_tokens = WINDOW_MEMORY // bytes_per_token
    for i, text in enumerate(raw.texts):
        size = len(text) + (len(raw.text_pairs[i]) if raw.text_pairs is not None else 0)
        if raw.words is not None:
            count, unit = sum(1 for word in raw.words[i] if word), "words"
            tokens, limit = count, max_tokens
        else:
            count, unit = size, "characters"
            tokens, limit = size // 4, 4 * max_tokens
        if tokens > max_tokens:
            gib = tokens * bytes_per_token / 2**30
            raise InputTooLargeError(
                f"input {i} has {count:,} {unit}: with long_texts='window' its {n_layers} hidden "
                f"states would take about {gib:.1f} GiB until its windows are stitched; the limit "
                f"for this model and these layers is {limit:,} {unit} per input. Split such "
                "documents (e.g. into paragraphs), ask for fewer layers, or use long_texts='truncate'",
                index=i,
            )


@dataclass(frozen=True, slots=True)
class Window:
    """One window of a long input: ``positions[j]`` is the position in the full input of the
    window's token ``j``; ``scores[j]`` its max-context score (-inf where the token is taken from
    elsewhere regardless, i.e. special tokens)."""

    ids: tuple[int, ...]
    type_ids: tuple[int, ...]
    positions: np.ndarray
    scores: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


def _runs(item: EncodedInput, segment: int) -> tuple[int, int]:
    positions = [p for p, s in enumerate(item.sequence_ids) if s == segment]
    if not positions:
        return 0, 0
    return positions[0], positions[-1] + 1


def plan_windows(
    item: EncodedInput, max_length: int, stride: int | None = None, *, causal: bool = False
) -> list[Window]:
    """Windows covering ``item``. ``stride`` defaults to half the room left for content; ``causal``
    scores each token by its left context only (see the module's docstring)."""
    n = len(item)
    is_pair = item.text_pair is not None
    slide_segment = 1 if is_pair else 0
    start, end = _runs(item, slide_segment)
    fixed_head = list(range(0, start))  # [CLS] (+ first segment + [SEP] for pairs)
    fixed_tail = list(range(end, n))  # final [SEP]
    room = max_length - len(fixed_head) - len(fixed_tail)
    if room < 1 and not is_pair:
        raise InputError(
            f"input {item.index}: a window of {max_length} tokens has no room besides its special tokens; "
            "use a larger max_length",
            index=item.index,
        )
    if room < 1:
        raise InputError(
            f"input {item.index}: the first segment of this pair takes {len(fixed_head) + len(fixed_tail)} "
            f"of the {max_length} tokens a window holds; windows slide over the second segment only, so "
            "shorten the first segment, swap the pair, or use long_texts='truncate'",
            index=item.index,
        )
    step = stride if stride is not None else max(1, room // 2)
    if not 1 <= step <= room:
        raise OptionError(f"stride={stride} must be between 1 and the window's content length, {room}")
    content = end - start
    spans: list[tuple[int, int]] = []
    offset = 0
    while True:
        length = min(room, content - offset)
        spans.append((offset, length))
        if offset + length >= content:
            break
        offset += min(length, step)
    windows = []
    for k, (offset, length) in enumerate(spans):
        body = list(range(start + offset, start + offset + length))
        positions = np.asarray(fixed_head + body + fixed_tail, dtype=np.int64)
        scores = np.full(len(positions), -np.inf)
        j = np.arange(length)
        body_scores = j.astype(np.float64) if causal else np.minimum(j, length - 1 - j) + 0.01 * length
        scores[len(fixed_head) : len(fixed_head) + length] = body_scores
        # fixed tokens: leading ones from the first window, trailing ones from the last
        if k == 0:
            scores[: len(fixed_head)] = np.inf
        if k == len(spans) - 1:
            scores[len(fixed_head) + length :] = np.inf
        windows.append(
            Window(
                ids=tuple(item.ids[p] for p in positions),
                type_ids=tuple(item.type_ids[p] for p in positions),
                positions=positions,
                scores=scores,
            )
        )
    return windows


def best_window(windows: Sequence[Window], n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """For each position of the full input: the window that supplies it and the row in that window."""
    best_score = np.full(n_tokens, -np.inf)
    source = np.full(n_tokens, -1, dtype=np.int64)
    row = np.full(n_tokens, -1, dtype=np.int64)
    for k, window in enumerate(windows):
        better = window.scores > best_score[window.positions]  # strict: the first best window wins
        picked = window.positions[better]
        best_score[picked] = window.scores[better]
        source[picked] = k
        row[picked] = np.flatnonzero(better)
    if (source < 0).any():
        raise RuntimeError(f"windows leave positions {np.flatnonzero(source < 0).tolist()} uncovered")
    return source, row


def stitch(
    parts: Sequence[np.ndarray], windows: Sequence[Window], n_tokens: int, token_axis: int
) -> np.ndarray:
    """Assemble per-window arrays (token axis ``token_axis``) into one array for the full input."""
    source, row = best_window(windows, n_tokens)
    shape = list(parts[0].shape)
    shape[token_axis] = n_tokens
    out = np.empty(shape, dtype=parts[0].dtype)
    for k, part in enumerate(parts):
        mine = np.flatnonzero(source == k)
        if mine.size:
            taken = np.take(part, row[mine], axis=token_axis)
            index: list[slice | np.ndarray] = [slice(None)] * out.ndim
            index[token_axis] = mine
            out[tuple(index)] = taken
    return out
