"""The probe tasks: tokens (tags, entities), sentences (classes), pairs (similarity), and probe()."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from .._features.fuse import check_fusion, fusion_layers
from .._features.names import GENERIC_FUSIONS, NAMED_FUSIONS, SUBWORD_POOLS, SubwordPool
from .._host.memory import available_memory
from ..errors import InputError, OptionError, check_choice
from .linear import fit_predict, require_sklearn, scalar_mix_probe
from .result import ProbeResult, ProbeRow, ProbeRun
from .sources import (
    LayerSource,
    distinct_fusions,
    fused,
    fusion_rows,
    random_twin,
)
from .tagging import probe_tokens
from .tasks import entity_f1, read_conll2003, read_conllu, read_table, require_classes

if TYPE_CHECKING:
    from .._encoder import Encoder

logger = logging.getLogger("layerwise")

Task = Literal["conllu", "conll", "tsv", "pairs"]
TASKS: tuple[str, ...] = ("conllu", "conll", "tsv", "pairs")
TABLE7_FUSIONS: tuple[str, ...] = tuple(NAMED_FUSIONS)


def _sentence_features(encoder, texts, progress):
    return encoder.embed(texts, layers="all", pool="mean", long_texts="window", progress=progress)


def _probe_sentences(encoder, train_texts, train_labels, dev_texts, dev_labels, run: ProbeRun) -> tuple:
    seed, progress = run.seed, run.progress
    classes = sorted(set(train_labels))
    require_classes(classes, "labels")
    index = {c: i for i, c in enumerate(classes)}
    y_train = np.asarray([index[c] for c in train_labels])
    y_dev = np.asarray([index.get(c, -1) for c in dev_labels])

    def features(enc) -> tuple[np.ndarray, np.ndarray]:
        a = _sentence_features(enc, train_texts, progress).transpose(1, 0, 2)  # (layers, n, hidden)
        b = _sentence_features(enc, dev_texts, progress).transpose(1, 0, 2)
        return a, b

    f_train, f_dev = features(encoder)
    rows = []
    for k in range(encoder.n_hidden_states):
        acc = float((fit_predict(f_train[k], y_train, f_dev[k], seed=seed) == y_dev).mean())
        rows.append(ProbeRow(f"L{k}", "layer", (k,), acc, acc))
    train_source, dev_source = LayerSource(f_train), LayerSource(f_dev)

    def fit_fusion(name: str) -> tuple[float, float]:
        a, b = fused(train_source, encoder, name), fused(dev_source, encoder, name)
        acc = float((fit_predict(a, y_train, b, seed=seed) == y_dev).mean())
        return acc, acc

    n_hidden = encoder.n_hidden_states
    rows += fusion_rows(rows, distinct_fusions(run.fusions, n_hidden), n_hidden, fit_fusion)
    mix_weights = None
    if run.scalar_mix:
        pred, mix_weights = scalar_mix_probe(f_train, y_train, f_dev, n_classes=len(classes), seed=seed)
        acc = float((pred == y_dev).mean())
        rows.append(ProbeRow("scalar_mix", "scalar_mix", tuple(range(encoder.n_hidden_states)), acc, acc))
    if "random_model" in run.controls:
        with tempfile.TemporaryDirectory(prefix="layerwise-random-") as folder:
            r_train, r_dev = features(random_twin(encoder, seed, Path(folder)))
            for row in rows:
                if row.kind == "layer":
                    k = row.layers[0]
                    row.random_model = float(
                        (fit_predict(r_train[k], y_train, r_dev[k], seed=seed) == y_dev).mean()
                    )
    return rows, mix_weights, len(y_train), len(y_dev)


def _gold_scores(source, values: list[str], column: str) -> list[float]:
    """Gold similarity scores: finite numbers that are not all equal (Spearman needs a ranking)."""
    try:
        scores = [float(v) for v in values]
    except ValueError as exc:
        raise InputError(f"{source}: column {column!r} must hold numbers ({exc})") from None
    for row, score in enumerate(scores):
        if not np.isfinite(score):
            raise InputError(
                f"{source}: data row {row + 1} has the gold score {values[row]!r} in column {column!r}; "
                "every score must be a finite number: drop or fix the row"
            )
    if len(set(scores)) < 2:
        raise InputError(
            f"{source}: every gold score in column {column!r} is {scores[0] if scores else 'missing'}; "
            "a rank correlation needs at least two different scores"
        )
    return scores


def _probe_pairs(encoder, firsts, seconds, scores, run: ProbeRun) -> tuple:
    from scipy.stats import spearmanr

    gold, progress = np.asarray(scores, dtype=np.float64), run.progress

    def layer_vectors(enc) -> tuple[np.ndarray, np.ndarray]:
        a = _sentence_features(enc, firsts, progress).transpose(1, 0, 2)
        b = _sentence_features(enc, seconds, progress).transpose(1, 0, 2)
        return a, b

    def spearman(u: np.ndarray, v: np.ndarray) -> float:
        cos = np.sum(u * v, axis=-1) / np.maximum(
            np.linalg.norm(u, axis=-1) * np.linalg.norm(v, axis=-1), 1e-12
        )
        return float(spearmanr(cos, gold).statistic)

    a, b = layer_vectors(encoder)
    rows = [ProbeRow(f"L{k}", "layer", (k,), spearman(a[k], b[k])) for k in range(encoder.n_hidden_states)]
    for name in run.fusions:
        fa, fb = fused(LayerSource(a), encoder, name), fused(LayerSource(b), encoder, name)
        layers = fusion_layers(name, encoder.n_hidden_states)
        assert layers is not None, f"{name} is a named fusion"  # probe() refuses the generic ones
        rows.append(ProbeRow(name, "fusion", layers, spearman(fa, fb)))
    if "random_model" in run.controls:
        with tempfile.TemporaryDirectory(prefix="layerwise-random-") as folder:
            ra, rb = layer_vectors(random_twin(encoder, 0, Path(folder)))
            for row in rows:
                if row.kind == "layer":
                    row.random_model = spearman(ra[row.layers[0]], rb[row.layers[0]])
    return rows, None, 0, len(gold)


def _checked_fusions(fuses: Sequence[str], controls: Sequence[str]) -> tuple[str, ...]:
    """The fusions a probe runs besides every single layer (a named fusion of the model's own
    layers each), its ``controls`` checked too."""
    for control in controls:
        check_choice("controls item", control, ("random_model", "control_task"))
    fusions = tuple(fuses)
    for fuse in fusions:
        check_fusion(fuse)
        if fuse in GENERIC_FUSIONS:  # they fuse the layers a caller lists; a probe lists none
            raise OptionError(
                f"fuses: {fuse!r} fuses the layers you choose, and a probe chooses none; name a fusion "
                f"of its own layers: {', '.join(NAMED_FUSIONS)}"
            )
    return fusions


def probe(
    task: Task,
    *,
    train: str | os.PathLike | None = None,
    dev: str | os.PathLike | None = None,
    data: str | os.PathLike | None = None,
    encoder: Encoder | None = None,
    model: str | None = None,
    column: str | None = None,
    text_column: str = "sentence",
    label_column: str = "label",
    first_column: str = "sentence1",
    second_column: str = "sentence2",
    score_column: str = "score",
    max_train: int | None = None,
    max_dev: int | None = None,
    subword: SubwordPool = "first",
    fuses: Sequence[str] = TABLE7_FUSIONS,
    controls: Sequence[str] = ("random_model", "control_task"),
    scalar_mix: bool = True,
    seed: int = 0,
    memory_budget: int | None = None,
    progress: bool | None = None,
) -> ProbeResult:
    """Probe every layer and fusion of ``encoder`` (or ``model``) on a task; see the module docs.

    ``train``/``dev`` files for conllu, conll and tsv; ``data`` for pairs. ``column`` picks the
    label column (conllu: upos, xpos, deprel…; conll: ner, pos, chunk). Word features larger
    than ``memory_budget`` bytes (default: half the available memory) go through a store on disk.
    ``fuses`` names the fusions probed besides every single layer (default: the BERT paper's Table 7)."""
    require_sklearn()
    check_choice("task", task, TASKS)
    check_choice("subword", subword, SUBWORD_POOLS)
    fusions = _checked_fusions(fuses, controls)
    started = time.perf_counter()
    if encoder is None:
        from .._encoder import Encoder

        encoder = Encoder(model)
    run = ProbeRun(
        fusions,
        tuple(controls),
        scalar_mix,
        subword,
        seed,
        progress,
        budget=memory_budget or available_memory() // 2,
    )
    unit, sentences = {"text": "sentences", "image": "images", "audio": "clips"}[encoder.modality], None
    if task in ("conllu", "conll"):
        column, metric, found, sentences = _tagging_task(
            encoder, task, train, dev, column, max_train, max_dev, run
        )
        unit = "words"
    elif task == "tsv":
        metric = "accuracy"
        found = _sentence_task(encoder, train, dev, (text_column, label_column), max_train, max_dev, run)
    else:
        metric, unit = "Spearman", "pairs"
        found = _pairs_task(encoder, data or dev, (first_column, second_column, score_column), run)
    rows, weights, n_train, n_dev = found
    center = None
    if weights is not None:
        center = float(np.sum(np.asarray(weights) * np.arange(len(weights))))
    return ProbeResult(
        task=task if column is None else f"{task}:{column}",
        metric=metric,
        model=encoder.name,
        rows=rows,
        n_train=n_train,
        n_dev=n_dev,
        seconds=time.perf_counter() - started,
        scalar_mix_weights=None if weights is None else [float(w) for w in weights],
        center_of_gravity=center,
        settings={"subword": subword, "seed": seed, "controls": list(controls), "max_train": max_train},
        unit=unit,
        n_sentences=sentences,
    )


def _tagging_task(
    encoder,
    task: str,
    train,
    dev,
    column: str | None,
    max_train: int | None,
    max_dev: int | None,
    run: ProbeRun,
) -> tuple[str, str, tuple, tuple[int, int]]:
    """``(label column, metric, found, (train, dev) sentences)`` of a CoNLL-U or CoNLL-2003 task:
    words tagged from ``column`` (default upos / ner), scored by accuracy, or entity F1 for
    CoNLL-2003's NER."""
    if train is None or dev is None:
        raise OptionError(f"task {task!r} needs train= and dev= files")
    if task == "conllu":
        reader, metric, metric_fn, column = read_conllu, "accuracy", None, column or "upos"
    else:
        reader, metric, metric_fn, column = read_conll2003, "entity F1", entity_f1, column or "ner"
    if task == "conll" and column != "ner":
        metric, metric_fn = "accuracy", None
    tr = reader(train, column).head(max_train)
    dv = reader(dev, column).head(max_dev)
    return column, metric, probe_tokens(encoder, tr, dv, metric_fn, run), (len(tr), len(dv))


def _pairs_task(encoder, source, columns: tuple[str, str, str], run: ProbeRun) -> tuple:
    """A sentence-pair task: ``columns`` are (first sentence, second sentence, gold score)."""
    if source is None:
        raise OptionError("task 'pairs' needs data= (a TSV/CSV with two sentence columns and a score)")
    first, second, score = columns
    table = read_table(source, [first, second, score])
    scores = _gold_scores(source, table[score], score)
    return _probe_pairs(encoder, table[first], table[second], scores, run)


def _sentence_task(
    encoder, train, dev, columns: tuple[str, str], max_train: int | None, max_dev: int | None, run: ProbeRun
) -> tuple:
    """A TSV sentence-classification task: ``columns`` are (text, label) of the two files."""
    if train is None or dev is None:
        raise OptionError("task 'tsv' needs train= and dev= files with a header row")
    text, label = columns
    a, b = read_table(train, [text, label]), read_table(dev, [text, label])
    n = max_train or len(a[text])
    return _probe_sentences(encoder, a[text][:n], a[label][:n], b[text][:max_dev], b[label][:max_dev], run)
