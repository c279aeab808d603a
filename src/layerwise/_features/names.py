"""The names of the pooling modes, the special-token rules, the output dtypes and the layer
fusions: each list once.

NumPy-free, so that the command line's help and the server's schema read them without importing the
arithmetic (pool.py, fuse.py). A new pooling mode or fusion is named here; pool.py or fuse.py
computes it (docs/internals.md: what a new pooling option touches)."""

from __future__ import annotations

from typing import Any, Literal, get_args

from ..errors import OptionError

# the type checkers' Literal, and its values for the checks and the front ends
SentencePool = Literal["cls", "mean", "max", "last"]
SENTENCE_POOLS: tuple[str, ...] = get_args(SentencePool)
SubwordPool = Literal["first", "last", "mean", "first_last", "max"]
SUBWORD_POOLS: tuple[str, ...] = get_args(SubwordPool)
SpecialTokens = Literal["include", "exclude"]
SPECIAL_TOKENS: tuple[str, ...] = get_args(SpecialTokens)
OutputDtype = Literal["float32", "float16"]
OUTPUT_DTYPES: tuple[str, ...] = get_args(OutputDtype)

# name -> (layer spec, operation)
NAMED_FUSIONS: dict[str, tuple[str | int, str]] = {
    "embeddings": (0, "select"),
    "last": (-1, "select"),
    "second_to_last": (-2, "select"),
    "sum_last4": ("last4", "sum"),
    "mean_last4": ("last4", "mean"),
    "concat_last4": ("last4", "concat"),
    "sum_all": ("all", "sum"),
    "mean_all": ("all", "mean"),
}
GENERIC_FUSIONS: tuple[str, ...] = ("mean", "sum", "concat")
FUSIONS: tuple[str, ...] = (*NAMED_FUSIONS, *GENERIC_FUSIONS)


# the help of every front end that takes them (CLI options, the server's schema)
POOL_HELP = f"token | word:{'|'.join(SUBWORD_POOLS)} | sentence:{'|'.join(SENTENCE_POOLS)}"
FUSE_HELP = f"{', '.join(NAMED_FUSIONS)}; or {', '.join(GENERIC_FUSIONS)} over the layers"


def pool_names() -> list[str]:
    """Every ``--pool`` value: token, word:<subword pool>, sentence:<sentence pool>."""
    return ["token"] + [f"word:{m}" for m in SUBWORD_POOLS] + [f"sentence:{m}" for m in SENTENCE_POOLS]


def sentence_convention(st: Any) -> tuple[str, bool]:
    """``(pool, normalize)`` of sentence-transformers' ``encode()`` for a model whose
    ``SentenceTransformersConfig`` (_model/loading/sentence_transformers.py) is ``st`` (mean, no
    normalisation when it has no sentence-transformers config); a pooling layerwise does not
    implement is an error, never a silent fallback to another pooling."""
    pool, normalize = (st.pool, st.normalize) if st else ("mean", False)
    pool = "last" if pool == "lasttoken" else pool  # sentence-transformers' name for it
    if pool not in SENTENCE_POOLS:
        raise OptionError(f"this model pools with {pool!r}; layerwise implements {', '.join(SENTENCE_POOLS)}")
    return pool, normalize
