"""OutputPlan: what a run returns, as one validated value that every front end shares.

    plan = OutputPlan.parse(layers="last4", pool="sentence:mean", fuse="concat_last4")
    plan.hidden_states(7)          # (3, 4, 5, 6): what the forward pass must compute
    for index, vector in plan.apply(stream, n_hidden_states=7): ...

A plan is layers x level (token | word | sentence) x pooling mode x special-token rule x fusion x
output dtype. ``parse`` takes the string forms of the command line and of HTTP requests
(``--layers last4 --pool word:mean --fuse concat_last4``) and is the only place their rules live:
a fusion needs word or sentence pooling; a named fusion picks its own layers; special tokens only
matter for sentence pooling. ``apply`` turns a stream of LayerStacks into the requested results.
NumPy only: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import LayerwiseError, OptionError, check_choice
from ..results import LayerStack, SentenceVector, WordVectors
from .fuse import GENERIC_FUSIONS, check_fusion, fuse_layers, fusion_layers
from .layers import LayerSpec, resolve_layers
from .pool import SENTENCE_POOLS, SPECIAL_TOKENS, SUBWORD_POOLS, pool_sentence, pool_words

Level = Literal["token", "word", "sentence"]
OutputDtype = Literal["float32", "float16"]
OUTPUT_DTYPES: tuple[str, ...] = ("float32", "float16")
Result = LayerStack | WordVectors | SentenceVector


def _names_fusion_layers(layers: LayerSpec, fuse: str) -> bool:
    """Whether ``layers`` names exactly the named fusion's own hidden states for any depth
    ("last4" with concat_last4, -1 with last): then giving both is redundant, not a conflict."""
    try:
        return all(resolve_layers(layers, n) == fusion_layers(fuse, n) for n in (13, 25))
    except LayerwiseError:
        return False


def _pool_choices() -> list[str]:
    return ["token"] + [f"word:{m}" for m in SUBWORD_POOLS] + [f"sentence:{m}" for m in SENTENCE_POOLS]


@dataclass(frozen=True)
class OutputPlan:
    """Layers, level, pooling mode, special-token rule, fusion and output dtype of a run.

    ``layers`` is a layer spec (None: all, or the fusion's own layers); ``mode`` the word or
    sentence pooling mode (None at token level)."""

    layers: LayerSpec | None = None
    level: Level = "token"
    mode: str | None = None
    special_tokens: str = "include"
    fuse: str | None = None
    dtype: OutputDtype = "float32"
    normalize: bool = False

    def __post_init__(self) -> None:
        check_choice("level", self.level, ("token", "word", "sentence"))
        modes = {"token": (None,), "word": SUBWORD_POOLS, "sentence": SENTENCE_POOLS}[self.level]
        if self.mode not in modes:
            raise OptionError(f"pool {self.pool!r} is not valid; choose one of {', '.join(_pool_choices())}")
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
    ) -> OutputPlan:
        """The plan for string options as the CLI and the HTTP service take them:
        ``pool`` is ``"token"``, ``"word:MODE"`` or ``"sentence:MODE"``."""
        if not isinstance(pool, str):
            raise OptionError(
                f"pool={pool!r} must be a string such as 'token', 'word:first' or 'sentence:mean'"
            )
        level, _, mode = pool.partition(":")
        if level not in ("token", "word", "sentence") or (level == "token") == bool(mode):
            raise OptionError(f"pool {pool!r} is not valid; choose one of {', '.join(_pool_choices())}")
        # a named fusion picks its own layers: the CLI's default "all" then means "not given"
        if fuse is not None and layers == "all" and fuse not in GENERIC_FUSIONS:
            layers = None
        return cls(layers, level, mode or None, special_tokens, fuse, dtype, normalize)  # type: ignore[arg-type]

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
        if self.level == "word":
            words = pool_words(stack, self.mode)  # type: ignore[arg-type]
            if self.fuse is None:
                return words
            fused = fuse_layers(words.vectors, layers, self.fuse, n_hidden_states=n_hidden_states, axis=0)
            return WordVectors(**{**words.__dict__, "vectors": fused, "fuse": self.fuse})
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
        }
