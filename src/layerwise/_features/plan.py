"""OutputPlan: what a run returns, as one validated value that every front end shares.

    plan = OutputPlan.parse(layers="last4", pool="sentence:mean", fuse="concat_last4")
    plan.hidden_states(7)          # (3, 4, 5, 6): what the forward pass must compute
    for index, vector in plan.apply(stream, n_hidden_states=7): ...

A plan is layers x level (token | word | sentence) x pooling mode x special-token rule x fusion x
output dtype, with how the run gets there: long texts truncated or windowed (and the windows'
stride) and a decoder's final norm (``final_norm``: None takes the Encoder's default).
``parse`` takes the string forms of the command line and of HTTP requests
(``--layers last4 --pool word:mean --fuse concat_last4``) and is the only place their rules live:
a fusion needs word or sentence pooling; a named fusion picks its own layers; special tokens only
matter for sentence pooling. ``apply`` turns a stream of LayerStacks into the requested results.
NumPy only: no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .._results import LayerStack, SentenceVector, WordVectors
from .._settings.long_texts import LongTexts, check_long_texts
from .._settings.settings import NUMBERS, FinalNorm, check_final_norm
from ..errors import LayerwiseError, OptionError, check_choice
from .fuse import check_fusion, fuse_layers, fusion_layers
from .layers import LayerSpec, resolve_layers
from .names import (
    GENERIC_FUSIONS,
    OUTPUT_DTYPES,
    SENTENCE_POOLS,
    SPECIAL_TOKENS,
    SUBWORD_POOLS,
    OutputDtype,
    pool_names,
)
from .pool import pool_sentence, pool_words

Level = Literal["token", "word", "sentence"]
Result = LayerStack | WordVectors | SentenceVector


def _names_fusion_layers(layers: LayerSpec, fuse: str) -> bool:
    """Whether ``layers`` names exactly the named fusion's own hidden states for any depth
    ("last4" with concat_last4, -1 with last): then giving both is redundant, not a conflict."""
    try:
        return all(resolve_layers(layers, n) == fusion_layers(fuse, n) for n in (13, 25))
    except LayerwiseError:
        return False


def levelled_pool(pool: str) -> str:
    """``pool`` with its level: a bare sentence mode ("mean", as ``Encoder.embed`` takes it) is
    ``"sentence:MODE"``, a bare word-only mode ("first") ``"word:MODE"``; anything else as given."""
    if pool in SENTENCE_POOLS:
        return f"sentence:{pool}"
    if pool in SUBWORD_POOLS:
        return f"word:{pool}"
    return pool


def pool_spellings() -> list[str]:
    """Every ``pool`` string ``OutputPlan.parse`` takes: the levelled forms and the bare modes."""
    bare = [*SENTENCE_POOLS, *(m for m in SUBWORD_POOLS if m not in SENTENCE_POOLS)]
    return pool_names() + bare


@dataclass(frozen=True)
class OutputPlan:
    """Layers, level, pooling mode, special-token rule, fusion and output dtype of a run.

    ``layers`` is a layer spec (None: all, or the fusion's own layers); ``mode`` the word or
    sentence pooling mode (None at token level; ``"sentence:mean"`` is taken as ``"mean"``).
    ``long_texts``: truncate inputs over the model maximum, or run them in windows of ``stride``
    (None: half a window). ``final_norm``: a decoder's final norm on the last hidden state (True),
    none (False) or every one ("all"); None: the Encoder's default (its ``final_norm``)."""

    # every entry changes the numbers (settings.NUMBERS): a run must not resume another that differs
    layers: LayerSpec | None = field(default=None, metadata=NUMBERS)
    level: Level = field(default="token", metadata=NUMBERS)
    mode: str | None = field(default=None, metadata={**NUMBERS, "recorded_as": "pool"})
    special_tokens: str = field(default="include", metadata=NUMBERS)
    fuse: str | None = field(default=None, metadata=NUMBERS)
    dtype: OutputDtype = field(default="float32", metadata=NUMBERS)
    normalize: bool = field(default=False, metadata=NUMBERS)
    long_texts: LongTexts = field(default="truncate", metadata=NUMBERS)
    stride: int | None = field(default=None, metadata=NUMBERS)
    final_norm: FinalNorm | None = field(default=None, metadata=NUMBERS)

    def __post_init__(self) -> None:
        check_choice("level", self.level, ("token", "word", "sentence"))
        if isinstance(self.mode, str) and self.mode.startswith(f"{self.level}:"):
            object.__setattr__(self, "mode", self.mode[len(self.level) + 1 :])  # both spellings
        modes = {"token": (None,), "word": SUBWORD_POOLS, "sentence": SENTENCE_POOLS}[self.level]
        if self.mode not in modes:
            choices = ", ".join(pool_names())
            wrong = _wrong_level(self.level, self.mode)
            raise OptionError(wrong or f"pool {self.pool!r} is not valid; choose one of {choices}")
        check_choice("special_tokens", self.special_tokens, SPECIAL_TOKENS)
        check_choice("dtype", self.dtype, OUTPUT_DTYPES)
        if self.special_tokens != "include" and self.level != "sentence":
            raise OptionError(
                f"special_tokens={self.special_tokens!r} applies to sentence pooling only; "
                f"pool={self.pool!r} keeps every token"
            )
        if not isinstance(self.normalize, bool):
            raise OptionError(f"normalize={self.normalize!r} must be True or False")
        if self.normalize and self.level != "sentence":
            raise OptionError("normalize=True applies to sentence vectors; use pool='sentence:MODE'")
        if self.fuse is not None:
            check_fusion(self.fuse)
            if self.level == "token":
                raise OptionError(
                    f"fuse={self.fuse!r} needs word or sentence pooling (pool='word:first', "
                    "'sentence:mean', …); for token vectors choose layers instead"
                )
            if (
                self.layers is not None
                and self.fuse not in GENERIC_FUSIONS
                and not _names_fusion_layers(self.layers, self.fuse)
            ):
                raise OptionError(
                    f"fuse={self.fuse!r} uses its own hidden states; drop layers={self.layers!r}, or fuse "
                    "the layers you choose with a generic fusion: fuse='mean', 'sum' or 'concat'"
                )
        check_long_texts(self.long_texts, self.stride)
        check_final_norm(self.final_norm, optional=True)

    @classmethod
    def parse(
        cls,
        *,
        layers: LayerSpec | None = None,
        pool: str = "token",
        fuse: str | None = None,
        special_tokens: str = "include",
        dtype: str = "float32",
        normalize: bool = False,
        long_texts: str = "truncate",
        stride: int | None = None,
        final_norm: FinalNorm | None = None,
    ) -> OutputPlan:
        """The plan for string options as the CLI and the HTTP service take them:
        ``pool`` is ``"token"``, ``"word:MODE"`` or ``"sentence:MODE"``; a bare sentence mode
        (``"mean"``, as ``Encoder.embed`` takes it) means ``"sentence:MODE"``, and a bare word-only
        mode (``"first"``, ``"first_last"``) ``"word:MODE"``."""
        if not isinstance(pool, str):
            raise OptionError(
                f"pool={pool!r} must be a string such as 'token', 'word:first' or 'sentence:mean'"
            )
        level, _, mode = levelled_pool(pool).partition(":")
        if level not in ("token", "word", "sentence") or (level == "token") == bool(mode):
            raise OptionError(f"pool {pool!r} is not valid; choose one of {', '.join(pool_names())}")
        # a named fusion picks its own layers: the CLI's default "all" then means "not given"
        if fuse is not None and layers == "all" and fuse not in GENERIC_FUSIONS:
            layers = None
        return cls(
            layers,
            level,  # type: ignore[arg-type]
            mode or None,
            special_tokens,
            fuse,
            dtype,  # type: ignore[arg-type]
            normalize,
            long_texts,  # type: ignore[arg-type]
            stride,
            final_norm,
        )

    @property
    def pool(self) -> str:
        return self.level if self.mode is None else f"{self.level}:{self.mode}"

    def hidden_states(self, n_hidden_states: int) -> tuple[int, ...]:
        """Hidden-state indices the forward pass must compute for this plan."""
        if self.fuse is not None:
            named = fusion_layers(self.fuse, n_hidden_states)
            if named is not None:
                return named
        return resolve_layers("all" if self.layers is None else self.layers, n_hidden_states)

    def row_shape(self, hidden_size: int, n_hidden_states: int) -> tuple[int, ...]:
        """Shape of one result row: ``(n_layers, dim)``, or ``(dim,)`` when fused."""
        layers = self.hidden_states(n_hidden_states)
        width = 2 * hidden_size if self.mode == "first_last" else hidden_size
        if self.fuse is None:
            return (len(layers), width)
        probe = np.zeros((len(layers), 1, width), dtype=np.float32)
        return (fuse_layers(probe, layers, self.fuse, n_hidden_states=n_hidden_states).shape[-1],)

    def result(self, stack: LayerStack, n_hidden_states: int) -> Result:
        """What this plan asks for, from one LayerStack (holding :meth:`hidden_states`)."""
        if self.level == "token":
            return stack
        layers = stack.layers
        # pooled, fused and normalised on the model's device (Encoder.iter_results): only sliced here
        finished = stack.pooled is not None
        if self.level == "word":
            words = pool_words(stack, self.mode, stack.pooled)  # type: ignore[arg-type]
            if self.fuse is None:
                return words
            if finished:
                fused = words.vectors[0]
            else:
                fused = fuse_layers(words.vectors, layers, self.fuse, n_hidden_states=n_hidden_states, axis=0)
            return WordVectors(**{**words.__dict__, "vectors": fused, "fuse": self.fuse})
        if stack.pooled is not None:
            return SentenceVector(stack.pooled if self.fuse is None else stack.pooled[0], stack.truncated)
        vector = pool_sentence(stack, self.mode, self.special_tokens)  # type: ignore[arg-type]
        if self.fuse is not None:
            vector = fuse_layers(vector, layers, self.fuse, n_hidden_states=n_hidden_states, axis=0)
        if self.normalize:  # as sentence-transformers' Normalize: x / max(||x||, 1e-12), per layer
            norms = np.linalg.norm(vector, axis=-1, keepdims=True)
            vector = (vector / np.maximum(norms, 1e-12)).astype(np.float32)
        return SentenceVector(vector, stack.truncated)

    def apply(
        self, stream: Iterable[tuple[int, LayerStack]], *, n_hidden_states: int
    ) -> Iterator[tuple[int, Result]]:
        """Map a stream of ``(index, LayerStack)`` to ``(index, result)``."""
        for index, stack in stream:
            yield index, self.result(stack, n_hidden_states)

    def with_final_norm(self, default: FinalNorm, *, takes: bool, name: str = "this model") -> OutputPlan:
        """This plan with its final norm settled: ``default`` (the Encoder's) where it has none. A
        model that ``takes`` no final norm option (an encoder without a final norm: BERT, BART) records
        none, and "all" is refused for it, naming the fix."""
        check_final_norm_for(self.final_norm, takes=takes, name=name)
        value: FinalNorm | None = default if self.final_norm is None else self.final_norm
        return dataclasses.replace(self, final_norm=value if takes else None)  # no final norm: null

    def meta(self, n_hidden_states: int) -> dict:
        """The plan as metadata for files, stores and responses (one word, one meaning)."""
        return {
            "layers": list(self.hidden_states(n_hidden_states)),
            "n_hidden_states": n_hidden_states,
            "layer_0": "embedding output",
            "level": self.level,
            "pool": self.pool,
            "fuse": self.fuse,
            "special_tokens": self.special_tokens if self.level == "sentence" else None,
            "normalize": self.normalize,
            "dtype": self.dtype,
            "long_texts": self.long_texts,
            "stride": self.stride,
            "final_norm": self.final_norm,
        }


def check_final_norm_for(value: FinalNorm | None, *, takes: bool, name: str = "this model") -> None:
    """A model without a final norm (BERT, BART: ``takes`` is False) cannot pass its states through
    one: "all" is an error naming the fix. True and False say the same of it (its states are the only
    ones there are), so a setting shared by a server's models (``--final-norm none``) works for all."""
    if not takes and value == "all":
        raise OptionError(
            f"final_norm='all' passes every hidden state through the model's final norm; {name} has "
            "none (its last hidden state is its last layer's output): leave final_norm out"
        )


def _wrong_level(level: str, mode: object) -> str | None:
    """The message for a pool of the other level (``embed(pool="word:first")``): name both calls."""
    if not isinstance(mode, str):
        return None
    other, _, name = mode.rpartition(":")
    if level == "sentence" and (other == "word" or (not other and name in SUBWORD_POOLS)):
        return (
            f"pool {mode!r} pools subwords into words, and this asks for sentence vectors: embed (and "
            f"--pool sentence:…) takes {', '.join(SENTENCE_POOLS)}. For word vectors use "
            f"embed_words(words, subword={name!r}), or --pool word:{name}"
        )
    if level == "word" and (other == "sentence" or (not other and name in SENTENCE_POOLS)):
        return (
            f"pool {mode!r} pools a whole text, and this asks for word vectors: embed_words (and --pool "
            f"word:…) takes {', '.join(SUBWORD_POOLS)}. For sentence vectors use "
            f"embed(texts, pool={name!r}), or --pool sentence:{name}"
        )
    return None
