"""Where probe features come from: word vectors in memory or, above a memory budget, a store on
disk read one layer at a time; fusions of them; the random-model twin."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .._features.fuse import fuse_layers, fusion_layers
from .._features.names import NAMED_FUSIONS, SubwordPool
from .._features.plan import OutputPlan
from ..errors import InputError
from .result import ProbeRow
from .tasks import TaggedSentences

if TYPE_CHECKING:
    from .._encoder import Encoder

logger = logging.getLogger("layerwise")


class LayerSource:
    """Word features by layer, held in memory or read layer by layer from a word-level store."""

    def __init__(self, array: np.ndarray | None = None, store=None) -> None:
        self._array, self._store = array, store
        if store is not None:
            # the store keeps texts in extraction order (longest first per block): back to input order
            spans = [store.rows(text_id) for text_id in store.text_ids()]
            self._order = np.concatenate([np.arange(a, b) for a, b in spans]) if spans else np.zeros(0, int)

    @property
    def n_rows(self) -> int:
        return self._array.shape[1] if self._array is not None else self._store.n_rows

    def layer(self, k: int) -> np.ndarray:
        if self._array is not None:
            return self._array[k]
        return np.asarray(self._store.array(k)[:], dtype=np.float32)[self._order]

    def layers(self, ks: Sequence[int], rows: np.ndarray | None = None) -> np.ndarray:
        if self._array is not None:
            picked = self._array[list(ks)]
            return picked if rows is None else picked[:, rows]
        return np.stack([self.layer(k) if rows is None else self.layer(k)[rows] for k in ks])


def word_sources(
    encoder: Encoder,
    sentences: TaggedSentences,
    subword: SubwordPool,
    progress: bool | None,
    *,
    budget: int,
    folder: Path,
) -> LayerSource:
    """Features of every word at every layer: in memory when they fit in ``budget`` bytes, else
    through a word-level store in ``folder`` that is read one layer at a time."""
    n_words = sum(len(w) for w in sentences.words)
    need = n_words * encoder.n_hidden_states * encoder.hidden_size * 4
    if need <= budget:
        return LayerSource(word_features(encoder, sentences, subword, progress))
    from ..store import extract_to_store, open_store

    logger.info(
        "features need %.1f GiB > budget %.1f GiB: going through a store in %s",
        need / 2**30,
        budget / 2**30,
        folder,
    )
    path = folder / f"words-{len(list(folder.iterdir()))}.lw"
    plan = OutputPlan.parse(pool=f"word:{subword}", long_texts="window", dtype="float32")
    extract_to_store(encoder, [" ".join(w) for w in sentences.words], path, plan, progress=progress)
    store = open_store(path)
    if store.n_rows != n_words:
        raise InputError(
            "the tokenizer splits some words differently when they are joined with spaces; "
            "pass a larger memory budget to keep the features in memory"
        )
    return LayerSource(store=store)


def word_features(
    encoder: Encoder, sentences: TaggedSentences, subword: SubwordPool, progress: bool | None
) -> np.ndarray:
    """``(n_layers, n_words, hidden)`` word vectors of every word of every sentence."""
    vectors = encoder.embed_words(
        sentences.words,
        subword=subword,
        layers="all",
        long_texts="window",
        progress=progress,
    )
    kept = [v.n_words for v in vectors]
    lost = sum(len(w) - k for w, k in zip(sentences.words, kept, strict=True))
    if lost:
        raise InputError(f"{lost} words produced no tokens; remove empty words from the data")
    return np.concatenate([v.vectors for v in vectors], axis=1)


def fused(source: LayerSource, encoder: Encoder, name: str, rows: np.ndarray | None = None) -> np.ndarray:
    wanted = fusion_layers(name, encoder.n_hidden_states)
    assert wanted is not None, f"{name} is a named fusion"
    picked = source.layers(wanted, rows)
    return fuse_layers(picked, wanted, name, n_hidden_states=encoder.n_hidden_states, axis=0)


def distinct_fusions(fusions: Sequence[str], n_hidden: int) -> list[tuple[str, int | str]]:
    """Each fusion with what its probe equals: a layer index (single-layer fusions), the name of an
    earlier fusion over the same layers (a mean equals a sum after standardisation), or itself."""
    out: list[tuple[str, int | str]] = []
    seen: dict[tuple, str] = {}
    for name in fusions:
        layers = fusion_layers(name, n_hidden)
        assert layers is not None, f"{name} is a named fusion"
        operation = NAMED_FUSIONS[name][1] if name in NAMED_FUSIONS else name
        if operation == "select":
            out.append((name, layers[0]))
            continue
        key = (tuple(layers), "concat" if operation == "concat" else "sum")
        out.append((name, seen.setdefault(key, name)))
    return out


def fusion_rows(
    layer_rows: Sequence[ProbeRow],
    distinct: Sequence[tuple[str, int | str]],
    n_hidden: int,
    fit_fusion,
) -> list[ProbeRow]:
    """Rows for the fusions in ``distinct`` (see :func:`distinct_fusions`): a single-layer fusion
    repeats that layer's row, a mean repeats the sum over the same layers, and only the rest are
    trained, with ``fit_fusion(name) -> (score, accuracy)``."""
    out: list[ProbeRow] = []
    for name, source in distinct:
        if isinstance(source, int):
            value, accuracy = layer_rows[source].score, layer_rows[source].accuracy
        elif source != name:
            value, accuracy = next((r.score, r.accuracy) for r in out if r.name == source)
        else:
            value, accuracy = fit_fusion(name)
        out.append(ProbeRow(name, "fusion", fusion_layers(name, n_hidden) or (), value, accuracy))
    return out


def random_twin(encoder: Encoder, seed: int, folder: Path) -> Encoder:
    """A randomly initialised model with the same architecture and tokenizer (or image processor)."""
    import torch
    from transformers import AutoModel

    from .._encoder import Encoder
    from .._model.loading.source import quiet_transformers

    torch.manual_seed(seed)
    with quiet_transformers():  # no "Writing model shards" bar in the middle of the probe's output
        model = AutoModel.from_config(encoder.config, trust_remote_code=encoder.settings.trust_remote_code)
        model.save_pretrained(folder)
        # a text model's tokenizer, an image model's processor (_encoder/media.py)
        preprocessing = encoder.tokenizer if encoder.tokenizer is not None else encoder.processor  # type: ignore[attr-defined]
        preprocessing.save_pretrained(folder)
    # the control runs as the model does: its settings whole, only the weights differ
    return Encoder.from_settings(encoder.settings.replace(model=str(folder)))


# ---------------------------------------------------------------------------------------------- tasks
