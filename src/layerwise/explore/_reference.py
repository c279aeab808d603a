"""The reference set the explorer compares a text with: the tokens of many sentences, every layer.

Built from the small UD English EWT sample shipped with layerwise (``ReferenceSet.sample``;
400 sentences, CC BY-SA 4.0, see ``data/UD_EWT_LICENSE.txt``) or from a token-level store
(``ReferenceSet.from_store``). Nearest neighbours are by cosine, per layer, among the reference
set's non-special tokens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .._results import LayerStack
from ..errors import InputError, OptionError

if TYPE_CHECKING:
    from .._encoder import Encoder

SAMPLE_NAME = "UD English EWT sample (400 sentences, CC BY-SA 4.0)"
# Enough tokens for neighbours to mean something, few enough to stay in memory for any model.
MAX_STORE_TOKENS = 50_000


def sample_sentences() -> list[tuple[str, str]]:
    """The built-in sample: ``(sent_id, text)`` of 400 UD English EWT sentences (CC BY-SA 4.0)."""
    text = resources.files("layerwise.explore").joinpath("data/ud_ewt_sample.tsv").read_text("utf-8")
    return [tuple(line.split("\t", 1)) for line in text.splitlines() if line]  # type: ignore[misc]


def sample_license() -> str:
    return resources.files("layerwise.explore").joinpath("data/UD_EWT_LICENSE.txt").read_text("utf-8")


@dataclass(frozen=True)
class Neighbour:
    """One reference token near the query: its sentence, token and span there, and the cosine."""

    cosine: float
    sentence: int  # index into ReferenceSet.stacks
    token: int  # index into that stack's tokens
    text: str
    token_text: str
    start: int  # character span of the token in ``text`` (or in the text pair, see ``segment``)
    end: int
    segment: int


@dataclass(eq=False)
class ReferenceSet:
    """Token vectors of many sentences at every held layer (``stacks``), and a cosine index over them."""

    name: str
    model: str
    stacks: list[LayerStack]
    layers: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not self.stacks:
            raise InputError(f"the reference set {self.name!r} holds no texts")
        self.layers = self.stacks[0].layers

    # ------------------------------------------------------------------ building
    @classmethod
    def sample(cls, encoder: Encoder) -> ReferenceSet:
        """The built-in UD EWT sample, run through ``encoder`` at every layer."""
        texts = [text for _, text in sample_sentences()]
        stacks = encoder.extract(texts, layers="all", progress=False)
        return cls(SAMPLE_NAME, encoder.name, stacks)

    @classmethod
    def from_store(cls, path: str | os.PathLike, *, max_tokens: int = MAX_STORE_TOKENS) -> ReferenceSet:
        """The first texts of a token-level store, up to ``max_tokens`` tokens."""
        from ..store import open_store

        store = open_store(path)
        if store.level != "token" or store.data.ndim != 3:
            raise OptionError(
                f"--store {str(path)!r} holds {store.level}-level"
                f"{' fused' if store.data.ndim != 3 else ''} vectors; the explorer needs token vectors "
                "at several layers: write one with layerwise extract corpus.txt -o corpus.lw --layers all"
            )
        stacks: list[LayerStack] = []
        n_tokens = 0
        for _, stack in store.items():
            assert isinstance(stack, LayerStack)  # a token-level store (checked above)
            stacks.append(stack)
            n_tokens += stack.n_tokens
            if n_tokens >= max_tokens:
                break
        return cls(f"{Path(path).name} ({len(stacks):,} texts, {n_tokens:,} tokens)", store.model, stacks)

    # ------------------------------------------------------------------ the index
    @cached_property
    def _index(self) -> tuple[np.ndarray, np.ndarray]:
        """Unit vectors ``(n_layers, n_rows, dim)`` float32 of every non-special token, and each
        row's ``(stack, token)``."""
        units, where = [], []
        for s, stack in enumerate(self.stacks):
            keep = np.flatnonzero(stack.word_ids >= 0)
            hidden = stack.hidden[:, keep].astype(np.float32)
            norms = np.linalg.norm(hidden, axis=-1, keepdims=True)
            units.append(hidden / np.maximum(norms, 1e-12))
            where.append(np.stack([np.full(len(keep), s), keep], axis=1))
        return np.concatenate(units, axis=1), np.concatenate(where).astype(np.int64)

    @property
    def n_tokens(self) -> int:
        return int(self._index[1].shape[0])

    def neighbours(self, vectors: np.ndarray, k: int = 5) -> list[list[Neighbour]]:
        """For ``vectors`` ``(n_layers, dim)`` (one token at each of :attr:`layers`), the ``k``
        nearest reference tokens by cosine at each layer, closest first."""
        vectors = np.asarray(vectors, dtype=np.float32)
        units, where = self._index
        if vectors.shape != (units.shape[0], units.shape[2]):
            raise InputError(
                f"neighbours takes one vector per reference layer, shape {(units.shape[0], units.shape[2])}, "
                f"got {vectors.shape}: the query must come from the reference set's model and layers"
            )
        k = max(1, min(int(k), units.shape[1]))
        query = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
        found: list[list[Neighbour]] = []
        for layer in range(units.shape[0]):
            cosines = units[layer] @ query[layer]
            top = np.argpartition(-cosines, k - 1)[:k]
            top = top[np.argsort(-cosines[top], kind="stable")]
            found.append([self._neighbour(float(cosines[r]), *where[r]) for r in top])
        return found

    def _neighbour(self, cosine: float, s: int, t: int) -> Neighbour:
        stack = self.stacks[s]
        segment = int(stack.segment_ids[t])
        start, end = (int(x) for x in stack.offsets[t])
        text = stack.segment_text(segment)
        return Neighbour(cosine, int(s), int(t), text, stack.tokens[t], start, end, segment)

    @cached_property
    def similarity(self) -> np.ndarray:
        """Linear CKA between every pair of layers over the reference tokens (at most 4,000 rows:
        the heatmap of ``layerwise analyze``, on this set)."""
        from .._analysis.stats import layer_similarity

        return layer_similarity(self.stacks, "cka", max_rows=4000)
