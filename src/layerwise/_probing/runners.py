"""The probe tasks: tokens (tags, entities), sentences (classes), pairs (similarity), and probe()."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from .._features.fuse import check_fusion, fusion_layers
from .._features.names import NAMED_FUSIONS, SUBWORD_POOLS, SubwordPool
from ..errors import InputError, OptionError, check_choice
from .linear import _require_sklearn, control_labels, fit_predict, scalar_mix_probe
from .result import ProbeResult, ProbeRow
from .sources import (
    LayerSource,
    _distinct_fusions,
    _fused,
    _fusion_rows,
    available_memory,
    random_twin,
    word_sources,
)
from .tasks import entity_f1, read_conll2003, read_conllu, read_table

if TYPE_CHECKING:
    from .._encoder import Encoder

logger = logging.getLogger("layerwise")

Task = Literal["conllu", "conll", "tsv", "pairs"]
TASKS: tuple[str, ...] = ("conllu", "conll", "tsv", "pairs")
TABLE7_FUSIONS: tuple[str, ...] = tuple(NAMED_FUSIONS)


class Stages:
    """One progress bar over the stages of a probe run (feature extraction, each probe, controls);
    shown on a terminal, silent otherwise; every stage is also logged with its time."""

    def __init__(self, enabled: bool | None, total: int) -> None:
        import sys

        if enabled is None:
            enabled = sys.stderr.isatty() and logger.getEffectiveLevel() <= logging.INFO
        self._bar = None
        self._started = time.perf_counter()
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            columns = (
                TextColumn("{task.description:<34}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            self._bar = Progress(*columns, console=Console(stderr=True), transient=True)
            self._bar.start()
            self._task = self._bar.add_task("probing", total=total)

    def step(self, description: str) -> None:
        logger.debug("probe stage: %s (%.0f s)", description, time.perf_counter() - self._started)
        if self._bar is not None:
            self._bar.update(self._task, description=description, advance=1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _probe_tokens(encoder, train, dev, *, metric_fn, metric, fusions, controls, scalar_mix, subword, seed,
                  progress, budget):  # fmt: skip
    classes = sorted({label for sentence in train.labels for label in sentence})
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted({label for sentence in dev.labels for label in sentence} - set(index))
    if unknown:
        logger.warning("dev labels %s never occur in training; those words count as errors", unknown[:10])
    y_train = np.asarray([index[label] for sentence in train.labels for label in sentence])
    y_dev = np.asarray([index.get(label, -1) for sentence in dev.labels for label in sentence])
    lengths = [len(s) for s in dev.words]
    n_hidden = encoder.n_hidden_states

    def score(pred: np.ndarray) -> tuple[float, float]:
        accuracy = float((pred == y_dev).mean())
        if metric_fn is None:
            return accuracy, accuracy
        tags, start = [], 0
        for n in lengths:
            tags.append([classes[p] for p in pred[start : start + n]])
            start += n
        return metric_fn(dev.labels, tags), accuracy

    distinct = _distinct_fusions(fusions, n_hidden)
    total = 2 + n_hidden + sum(source == name for name, source in distinct) + int(scalar_mix)
    total += n_hidden * ("control_task" in controls) + (2 + n_hidden) * ("random_model" in controls)
    stages = Stages(progress, total)
    with tempfile.TemporaryDirectory(prefix="layerwise-probe-") as scratch, contextlib.closing(stages):
        folder = Path(scratch)
        stages.step("extracting train features")
        f_train = word_sources(encoder, train, subword, False, budget=budget, folder=folder)
        stages.step("extracting dev features")
        f_dev = word_sources(encoder, dev, subword, False, budget=budget, folder=folder)
        rows: list[ProbeRow] = []
        for k in range(n_hidden):
            stages.step(f"probe L{k}")
            value, accuracy = score(fit_predict(f_train.layer(k), y_train, f_dev.layer(k), seed=seed))
            rows.append(ProbeRow(f"L{k}", "layer", (k,), value, accuracy))

        def fit_fusion(name: str) -> tuple[float, float]:
            stages.step(f"probe {name}")
            train_x, dev_x = _fused(f_train, encoder, name), _fused(f_dev, encoder, name)
            return score(fit_predict(train_x, y_train, dev_x, seed=seed))

        rows += _fusion_rows(rows, distinct, n_hidden, fit_fusion)
        mix_weights = None
        if scalar_mix:
            # the mix sees every layer at once: subsample training words if they would not fit
            per_row = n_hidden * encoder.hidden_size * 4
            keep = None
            if f_train.n_rows * per_row > budget:
                keep = np.sort(
                    np.random.default_rng(seed).choice(f_train.n_rows, budget // per_row, replace=False)
                )
            all_layers = list(range(n_hidden))
            stages.step("scalar-mix probe")
            pred, mix_weights = scalar_mix_probe(
                f_train.layers(all_layers, keep), y_train if keep is None else y_train[keep],
                f_dev.layers(all_layers), n_classes=len(classes), seed=seed,
            )  # fmt: skip
            value, accuracy = score(pred)
            rows.append(ProbeRow("scalar_mix", "scalar_mix", tuple(all_layers), value, accuracy))
        if "control_task" in controls:
            mapping = control_labels(train.words, train.labels, train.words + dev.words, seed)
            control_classes = {c: i for i, c in enumerate(sorted(set(mapping.values())))}
            c_train = np.asarray([control_classes[mapping[w.lower()]] for s in train.words for w in s])
            c_dev = np.asarray([control_classes[mapping[w.lower()]] for s in dev.words for w in s])
            for row in rows:
                if row.kind == "layer":
                    k = row.layers[0]
                    stages.step(f"control task L{k}")
                    predicted = fit_predict(f_train.layer(k), c_train, f_dev.layer(k), seed=seed)
                    row.control_task = float((predicted == c_dev).mean())
        f_train = f_dev = None  # free the features before the random model's are extracted
        if "random_model" in controls:
            twin = random_twin(encoder, seed, folder / "random-model")
            stages.step("random model: train features")
            r_train = word_sources(twin, train, subword, False, budget=budget, folder=folder)
            stages.step("random model: dev features")
            r_dev = word_sources(twin, dev, subword, False, budget=budget, folder=folder)
            for row in rows:
                if row.kind == "layer":
                    k = row.layers[0]
                    stages.step(f"random model L{k}")
                    row.random_model = score(
                        fit_predict(r_train.layer(k), y_train, r_dev.layer(k), seed=seed)
                    )[0]
    return rows, mix_weights, len(y_train), len(y_dev)


def _sentence_features(encoder, texts, progress):
    return encoder.embed(texts, layers="all", pool="mean", long_texts="window", progress=progress)


def _probe_sentences(
    encoder,
    train_texts,
    train_labels,
    dev_texts,
    dev_labels,
    *,
    fusions,
    controls,
    scalar_mix,
    seed,
    progress,
):
    classes = sorted(set(train_labels))
    index = {c: i for i, c in enumerate(classes)}
    y_train = np.asarray([index[c] for c in train_labels])
    y_dev = np.asarray([index.get(c, -1) for c in dev_labels])

    def run(enc) -> tuple[np.ndarray, np.ndarray]:
        a = _sentence_features(enc, train_texts, progress).transpose(1, 0, 2)  # (layers, n, hidden)
        b = _sentence_features(enc, dev_texts, progress).transpose(1, 0, 2)
        return a, b

    f_train, f_dev = run(encoder)
    rows = []
    for k in range(encoder.n_hidden_states):
        acc = float((fit_predict(f_train[k], y_train, f_dev[k], seed=seed) == y_dev).mean())
        rows.append(ProbeRow(f"L{k}", "layer", (k,), acc, acc))
    train_source, dev_source = LayerSource(f_train), LayerSource(f_dev)

    def fit_fusion(name: str) -> tuple[float, float]:
        a, b = _fused(train_source, encoder, name), _fused(dev_source, encoder, name)
        acc = float((fit_predict(a, y_train, b, seed=seed) == y_dev).mean())
        return acc, acc

    n_hidden = encoder.n_hidden_states
    rows += _fusion_rows(rows, _distinct_fusions(fusions, n_hidden), n_hidden, fit_fusion)
    mix_weights = None
    if scalar_mix:
        pred, mix_weights = scalar_mix_probe(f_train, y_train, f_dev, n_classes=len(classes), seed=seed)
        acc = float((pred == y_dev).mean())
        rows.append(ProbeRow("scalar_mix", "scalar_mix", tuple(range(encoder.n_hidden_states)), acc, acc))
    if "random_model" in controls:
        with tempfile.TemporaryDirectory(prefix="layerwise-random-") as folder:
            r_train, r_dev = run(random_twin(encoder, seed, Path(folder)))
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


def _probe_pairs(encoder, firsts, seconds, scores, *, fusions, controls, progress):
    from scipy.stats import spearmanr

    gold = np.asarray(scores, dtype=np.float64)

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
    for name in fusions:
        fa, fb = _fused(LayerSource(a), encoder, name), _fused(LayerSource(b), encoder, name)
        rows.append(ProbeRow(name, "fusion", fusion_layers(name, encoder.n_hidden_states), spearman(fa, fb)))
    if "random_model" in controls:
        with tempfile.TemporaryDirectory(prefix="layerwise-random-") as folder:
            ra, rb = layer_vectors(random_twin(encoder, 0, Path(folder)))
            for row in rows:
                if row.kind == "layer":
                    row.random_model = spearman(ra[row.layers[0]], rb[row.layers[0]])
    return rows, None, 0, len(gold)


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
    _require_sklearn()
    check_choice("task", task, TASKS)
    check_choice("subword", subword, SUBWORD_POOLS)
    for control in controls:
        check_choice("controls item", control, ("random_model", "control_task"))
    started = time.perf_counter()
    if encoder is None:
        from .._encoder import Encoder

        encoder = Encoder(model)
    fusions = tuple(fuses)
    for fuse in fusions:
        check_fusion(fuse)
    if task in ("conllu", "conll"):
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
        rows, weights, n_train, n_dev = _probe_tokens(
            encoder, tr, dv, metric_fn=metric_fn, metric=metric, fusions=fusions, controls=controls,
            scalar_mix=scalar_mix, subword=subword, seed=seed, progress=progress,
            budget=memory_budget or available_memory() // 2,
        )  # fmt: skip
    elif task == "tsv":
        if train is None or dev is None:
            raise OptionError("task 'tsv' needs train= and dev= files with a header row")
        a = read_table(train, [text_column, label_column])
        b = read_table(dev, [text_column, label_column])
        n = max_train or len(a[text_column])
        metric = "accuracy"
        rows, weights, n_train, n_dev = _probe_sentences(
            encoder, a[text_column][:n], a[label_column][:n],
            b[text_column][:max_dev], b[label_column][:max_dev],
            fusions=fusions, controls=controls, scalar_mix=scalar_mix, seed=seed, progress=progress,
        )  # fmt: skip
    else:
        source = data or dev
        if source is None:
            raise OptionError("task 'pairs' needs data= (a TSV/CSV with two sentence columns and a score)")
        table = read_table(source, [first_column, second_column, score_column])
        scores = _gold_scores(source, table[score_column], score_column)
        metric = "Spearman"
        rows, weights, n_train, n_dev = _probe_pairs(
            encoder, table[first_column], table[second_column], scores, fusions=fusions, controls=controls,
            progress=progress,
        )  # fmt: skip
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
    )
