"""The warnings about a call's inputs, once a call: inputs truncated at the model's maximum (with
how many tokens and words they lost) and pre-split words that produced no token, counted over
the blocks a call was tokenised in (block.py)."""

from __future__ import annotations

import logging

from .block import EncodedBlock

logger = logging.getLogger("layerwise")


def report_blocks(
    blocks: list[EncodedBlock], n_inputs: int, max_length: int, *, truncation: bool = True
) -> None:
    """The call's truncation warning (counts over all its blocks) and empty-word warning, once."""
    if truncation and any(b.truncated.any() for b in blocks):
        hit = [(b, i) for b in blocks for i in b.truncated.nonzero()[0].tolist()]
        first_block, i = hit[0]
        exact = all(bool(b.counts_exact[i]) for b, i in hit)
        logger.warning(
            "%d of %d inputs were longer than %d tokens and were truncated (first: input %d, %s%d tokens; "
            "%s%d words lost in all); their results have truncated=True. Pass long_texts='window' "
            "to keep every token with sliding windows.",
            len(hit),
            n_inputs,
            max_length,
            first_block.first + i,
            "" if first_block.counts_exact[i] else "at least ",
            int(first_block.n_untruncated[i]),
            "" if exact else "at least ",
            sum(int(b.words_lost[i]) for b, i in hit),
        )
    empty = [(b, i) for b in blocks for i in sorted(b.words_empty)]
    if empty:
        block, i = empty[0]
        words = block.words[i] if block.words is not None else ()
        word = words[block.words_empty[i][0]] if words else ""
        logger.warning(
            "%d words in %d inputs produced no token (first: input %d, word %d, %r); they keep their "
            "slot with a zero vector and are listed in words_empty",
            sum(len(b.words_empty[i]) for b, i in empty),
            len(empty),
            block.first + i,
            block.words_empty[i][0],
            word,
        )
