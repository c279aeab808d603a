"""Sentence and word features of an Encoder: ``embed``, ``encode``, ``embed_words``, ``features``.

Each is thin: an :class:`~layerwise.OutputPlan`, the one path from a plan to its outputs
(``Encoder.iter_results``; ``features`` pools the raw stream once per mode), and a function of
_features/stream.py that puts the results in input order. :class:`FeatureCalls` holds them over
any extractor that offers the one path (:class:`Extracting`: ``iter_results``, ``iter_batches``,
``iter_extract`` and the model's sizes); the Encoder (core.py: the model and the one path) is one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast

import numpy as np

from .._features.layers import LayerSpec
from .._features.names import SentencePool, SpecialTokens, SubwordPool, sentence_convention
from .._features.plan import OutputPlan
from .._features.stream import all_features, features_layers, sentence_matrix, word_vectors
from .._inputs.raw import as_texts
from .._inputs.words import split_word_inputs
from .._results import WordVectors
from .._settings.long_texts import LongTexts
from .._settings.settings import FinalNorm
from .batch_results import sentence_rows, word_results


class Extracting(Protocol):
    """What these calls use of the Encoder they are part of (core.py): its extraction and sizes.
    Typed by this interface, so that this module does not import core.py back."""

    n_hidden_states: int
    hidden_size: int
    sentence_transformers: Any

    def iter_results(self, plan: OutputPlan, texts: Sequence[str] | None = None, **inputs: Any) -> Any: ...
    def iter_batches(self, plan: OutputPlan, texts: Sequence[str] | None = None, **inputs: Any) -> Any: ...
    def iter_extract(self, texts: Sequence[str] | None = None, **options: Any) -> Any: ...


class FeatureCalls:
    """``embed``, ``encode``, ``embed_words`` and ``features``: the pooled features of an
    :class:`Extracting`, from its one path (``iter_results``, ``iter_batches``, ``iter_extract``).
    ``modality`` says what its inputs are: texts here, images for an image model (media.py)."""

    modality = "text"

    def one_input(self, value: object) -> bool:
        """Whether ``value`` is one input (a text), not a list of them."""
        return isinstance(value, str)

    def embed(
        self,
        texts: str | Sequence[str] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        layers: LayerSpec | None = None,
        pool: SentencePool = "mean",
        fuse: str | None = None,
        special_tokens: SpecialTokens = "include",
        normalize: bool = False,
        long_texts: LongTexts = "truncate",
        stride: int | None = None,
        progress: bool | None = None,
        final_norm: FinalNorm | None = None,
        dtype: str = "float32",
    ) -> np.ndarray:
        """Sentence vectors: ``(n_texts, n_layers, hidden)``; ``(n_texts, hidden)`` for one int layer
        or float depth (it drops the axis, as in NumPy); ``(n_texts, dim)`` with ``fuse``.

        ``pool``: cls, mean, max or last (a decoder's convention; ``"sentence:mean"`` is taken too);
        ``special_tokens``: include (default, as sentence-transformers) or exclude [CLS]/[SEP].
        ``fuse``: a named fusion (last, concat_last4, mean_all, …) or mean/sum/concat over
        ``layers``. ``normalize``: L2-normalise each vector. ``final_norm`` (decoders): see
        :meth:`extract`. ``dtype``: float32 or float16 vectors (pooled in float32, then cast once).
        A single string gives a single row."""
        enc = cast(Extracting, self)
        plan = OutputPlan(
            layers,
            "sentence",
            pool,
            special_tokens,
            fuse,
            dtype,  # type: ignore[arg-type]
            normalize=normalize,
            long_texts=long_texts,
            stride=stride,
            final_norm=final_norm,
        )
        single = self.one_input(texts)
        batch = [texts] if single else (as_texts(texts) if texts is not None else None)  # any iterable
        n_texts = len(batch) if batch is not None else len(pairs or ())
        batches, held = enc.iter_batches(plan, batch, text_pairs=text_pairs, pairs=pairs, progress=progress)  # type: ignore[arg-type]
        if batches is not None:  # each batch's rows into the result at once (batch_results.py)
            shape = (n_texts, *plan.row_shape(enc.hidden_size, enc.n_hidden_states))
            array = sentence_rows(batches, np.empty(shape, dtype=plan.dtype), plan, held)
        else:
            outputs = enc.iter_results(plan, batch, text_pairs=text_pairs, pairs=pairs, progress=progress)  # type: ignore[arg-type]
            array = sentence_matrix(
                outputs, n_texts, plan, n_hidden_states=enc.n_hidden_states, hidden_size=enc.hidden_size
            )
        if _drops_axis(layers, fuse):
            array = array[:, 0]
        return array[0] if single else array

    def encode(self, texts: str | Sequence[str], *, progress: bool | None = None) -> np.ndarray:
        """sentence-transformers' ``encode()``: the last layer, pooled and normalised as modules.json
        says, truncated at max_seq_length (else mean pooling, no normalisation)."""
        pool, normalize = sentence_convention(cast(Extracting, self).sentence_transformers)
        return self.embed(texts, layers=-1, pool=pool, normalize=normalize, progress=progress)  # type: ignore[arg-type]

    def embed_words(
        self,
        inputs: Sequence[str] | Sequence[Sequence[str]] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        words: Sequence[Sequence[str]] | None = None,
        subword: SubwordPool = "first",
        layers: LayerSpec | None = None,
        fuse: str | None = None,
        long_texts: LongTexts = "truncate",
        stride: int | None = None,
        progress: bool | None = None,
        final_norm: FinalNorm | None = None,
        dtype: str = "float32",
    ) -> list[WordVectors]:
        """Word vectors per input: ``WordVectors.vectors`` is ``(n_layers, n_words, dim)``,
        ``(n_words, dim)`` for one int layer or with ``fuse``. ``inputs``: raw texts (words found by
        the tokenizer's pre-tokenizer and character offsets) or pre-split word lists (aligned to your
        words); or pass ``words=`` / ``texts`` with ``text_pairs=`` as in :meth:`extract`.
        ``subword``: first (default, as in the BERT paper), last, mean, first_last or max.
        ``dtype``: float32 or float16 vectors (pooled in float32, then cast once)."""
        plan = OutputPlan(
            layers,
            "word",
            subword,
            fuse=fuse,
            dtype=dtype,  # type: ignore[arg-type]
            long_texts=long_texts,
            stride=stride,
            final_norm=final_norm,
        )
        texts, words = split_word_inputs(inputs, words)
        enc = cast(Extracting, self)
        n_inputs = len(next(x for x in (texts, pairs, words) if x is not None) or ())
        inputs_given = {"text_pairs": text_pairs, "pairs": pairs, "words": words, "progress": progress}
        batches, held = enc.iter_batches(plan, texts, **inputs_given)
        if batches is not None:  # each batch's words at once (batch_results.py)
            results = word_results(batches, [None] * n_inputs, plan, held)
        else:
            outputs = enc.iter_results(plan, texts, **inputs_given)
            results = word_vectors(outputs, n_inputs, plan.dtype)
        if _drops_axis(layers, fuse):
            results = [WordVectors(**{**r.__dict__, "vectors": r.vectors[0]}) for r in results]
        return results

    def features(
        self,
        texts: Sequence[str] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        pairs: Sequence[tuple[str, str]] | None = None,
        pools: Sequence[SentencePool] = ("mean",),
        fuses: Sequence[str] = ("last",),
        layers: LayerSpec | None = None,
        special_tokens: SpecialTokens = "include",
        long_texts: LongTexts = "truncate",
        stride: int | None = None,
        progress: bool | None = None,
        final_norm: FinalNorm | None = None,
    ) -> dict[tuple[str, str], np.ndarray]:
        """Every (pool, fusion) from ONE forward pass: ``{(pool, fuse): (n_texts, dim)}``."""
        enc = cast(Extracting, self)
        texts = as_texts(texts) if texts is not None else None  # any iterable; a str is refused
        pools, fuses = list(pools), list(fuses)
        extracted = features_layers(fuses, layers, pools, special_tokens, enc.n_hidden_states)
        stream = enc.iter_extract(
            texts,
            text_pairs=text_pairs,
            pairs=pairs,
            layers=extracted,
            long_texts=long_texts,
            stride=stride,
            progress=progress,
            final_norm=final_norm,
        )
        n_texts = len(texts) if texts is not None else len(pairs or ())
        results = all_features(
            stream,
            n_texts,
            pools=pools,
            fuses=fuses,
            layers=layers,
            extracted=extracted,
            special_tokens=special_tokens,
            n_hidden_states=enc.n_hidden_states,
            hidden_size=enc.hidden_size,
        )
        return {(p, f): results[(p, f)] for p in pools for f in fuses}


def _drops_axis(layers: LayerSpec | None, fuse: str | None) -> bool:
    """An int layer index (or a float depth, one layer too) drops the layer axis, as in NumPy; a
    list, range or string keeps it."""
    return fuse is None and isinstance(layers, int | float) and not isinstance(layers, bool)
