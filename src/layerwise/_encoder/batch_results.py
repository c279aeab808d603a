"""``embed`` and ``embed_words`` straight from the engine's batches: each batch's pooled rows go into
the result whole, with no LayerStack, EncodedInput or tuple made per input.

A sentence plan's batch arrives as ``(L, B, W)`` (``(1, B, D)`` fused), pooled, fused and
normalised on the model's device; it is written into the ``(n_inputs, L, W)`` result in one
assignment. A word plan's batch arrives as ``(L, n_words, W)``; what each input's WordVectors says
of its words (spans, segments, subword counts) is computed for the whole batch from the block's
columns and the token -> word map the device pools used, the same numbers
:func:`~layerwise._features.pool.pool_words` gives from a LayerStack.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .._engine.rows import Rows, block_stack
from .._features.plan import OutputPlan
from .._inputs.block import EncodedBlock, gather_index
from .._results import WordVectors, check_float16, check_float16_rows

Batches = Iterable[tuple[EncodedBlock, np.ndarray, Rows]]


def sentence_rows(batches: Batches, out: np.ndarray, plan: OutputPlan, layers: tuple[int, ...]) -> np.ndarray:
    """Fill ``out`` (n_inputs, L, W), or (n_inputs, D) fused, from each batch's pooled rows."""
    for block, rows, batch in batches:
        assert batch.array is not None
        values = batch.array[0] if plan.fuse is not None else np.swapaxes(batch.array, 0, 1)
        if out.dtype == np.float16:  # a value past its range would become inf
            names = [f"input {index}" for index in (block.first + rows).tolist()]
            check_float16_rows(values, names, () if plan.fuse else layers)
        out[block.first + rows] = values
    return out


def word_results(batches: Batches, results: list, plan: OutputPlan, layers: tuple[int, ...]) -> list:
    """Fill ``results`` (one slot per input) with each input's WordVectors, from the batches."""
    fused = plan.fuse is not None
    for block, rows, batch in batches:
        assert batch.array is not None
        words = _BatchWords(block, rows, batch)
        for k, i in enumerate(rows.tolist()):
            vectors, _ = batch[k]
            result: WordVectors
            if block.words_empty.get(i):  # pre-split words with no token keep a slot: pool_words' path
                made = plan.result(block_stack(block, i, vectors, {}, layers, "word"), len(layers))
                assert isinstance(made, WordVectors)
                result = made
            else:
                picked = np.ascontiguousarray(vectors[0] if fused else vectors)
                result = words.vectors(k, picked, plan.fuse, layers)
            if plan.dtype == "float16":
                check_float16(result.vectors, f"input {block.first + i}", () if fused else layers)
                result = WordVectors(**{**result.__dict__, "vectors": result.vectors.astype(np.float16)})
            results[block.first + i] = result
    return results


class _BatchWords:
    """The words of one batch's inputs, as the device pools grouped their tokens (``Rows.owner``,
    ``Rows.sizes``): each word's first and last token, span, segment, word id and subword count."""

    def __init__(self, block: EncodedBlock, rows: np.ndarray, batch: Rows) -> None:
        assert batch.owner is not None
        self.block, self.rows = block, rows
        n_words = sum(batch.sizes)
        tokens = np.flatnonzero(batch.owner >= 0)
        group = batch.owner[tokens]
        first = np.full(n_words, -1, dtype=np.int64)
        last = np.full(n_words, -1, dtype=np.int64)
        first[group[::-1]] = tokens[::-1]
        last[group] = tokens
        index = gather_index(block.starts, block.lengths, rows)  # the batch's tokens in the block
        offsets = block.offsets[index]
        self.spans = np.stack([offsets[first, 0], offsets[last, 1]], axis=1).astype(np.int32)
        self.segments = block.segments[index[first]]
        self.word_ids = block.word_ids[index[first]]
        self.n_subwords = np.bincount(group, minlength=n_words).astype(np.int32)
        self.bounds = np.concatenate([[0], np.cumsum(batch.sizes)]).astype(np.int64)

    def vectors(self, k: int, vectors: np.ndarray, fuse: str | None, layers: tuple[int, ...]) -> WordVectors:
        """The WordVectors of the batch's ``k``-th input, holding ``vectors``."""
        block, i = self.block, int(self.rows[k])
        lo, hi = int(self.bounds[k]), int(self.bounds[k + 1])
        spans, segments = self.spans[lo:hi], self.segments[lo:hi]
        pair = block.text_pairs[i] if block.text_pairs is not None else None
        given = block.words[i] if block.words is not None else None
        text = block.texts[i]
        if given is None and pair is None:  # the common case: every word is a slice of the text
            words = [text[start:end] for start, end in spans.tolist()]
        else:
            words = []
            for (start, end), segment, word_id in zip(
                spans.tolist(), segments.tolist(), self.word_ids[lo:hi].tolist(), strict=True
            ):
                if given is not None and segment == 0:
                    words.append(given[word_id])
                else:
                    words.append((pair if segment == 1 and pair is not None else text)[start:end])
        return WordVectors(
            vectors=vectors,
            layers=layers,
            words=tuple(words),
            spans=spans,
            segment_ids=segments,
            n_subwords=self.n_subwords[lo:hi],
            text=text,
            text_pair=pair,
            words_lost=int(block.words_lost[i]),
            fuse=fuse,
            words_empty=(),
        )
