"""The names of the pooling modes, the special-token rules, the output dtypes, the long-text rules
and the layer fusions: each list once.

NumPy-free, so that the command line's help and the server's schema read them without importing the
arithmetic (pool.py, fuse.py). A new pooling mode or fusion is named here; pool.py or fuse.py
computes it (docs/internals.md: what a new pooling option touches)."""

from __future__ import annotations

from typing import Any, Literal, get_args

from ..errors import OptionError, check_choice

# the type checkers' Literal, and its values for the checks and the front ends
SentencePool = Literal["cls", "mean", "max", "last"]
SENTENCE_POOLS: tuple[str, ...] = get_args(SentencePool)
SubwordPool = Literal["first", "last", "mean", "first_last", "max"]
SUBWORD_POOLS: tuple[str, ...] = get_args(SubwordPool)
SpecialTokens = Literal["include", "exclude"]
SPECIAL_TOKENS: tuple[str, ...] = get_args(SpecialTokens)
OutputDtype = Literal["float32", "float16"]
OUTPUT_DTYPES: tuple[str, ...] = get_args(OutputDtype)
LongTexts = Literal["truncate", "window"]
LONG_TEXTS: tuple[str, ...] = get_args(LongTexts)

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


def check_long_texts(long_texts: object, stride: object) -> None:
    """``long_texts`` is one of LONG_TEXTS, and ``stride`` (a window's step) is None or a whole
    number >= 1 that comes with windows: the plan's and the server's default's one rule."""
    check_choice("long_texts", long_texts, LONG_TEXTS)
    if stride is None:
        return
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise OptionError(f"stride={stride!r} must be a whole number >= 1 (or None)")
    if long_texts != "window":
        raise OptionError(
            f"stride={stride} applies to sliding windows only; pass long_texts='window' "
            "(--long-texts window) too or drop stride"
        )


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
