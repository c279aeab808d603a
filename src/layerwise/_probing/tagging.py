"""The token tasks' probe (tags per word, or entities): every layer, the fusions, the scalar mix and
both controls, over word features that may go through a store on disk (sources.py)."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .linear import control_labels, fit_predict, scalar_mix_probe
from .result import ProbeRow, ProbeRun
from .sources import distinct_fusions, fused, fusion_rows, random_twin, word_sources
from .tasks import require_classes

logger = logging.getLogger("layerwise")
Score = Callable[[np.ndarray], tuple[float, float]]  # predicted classes -> (task metric, accuracy)


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


def probe_tokens(encoder: Any, train: Any, dev: Any, metric_fn: Callable | None, run: ProbeRun) -> tuple:
    """``(rows, scalar-mix weights, n_train, n_dev)`` of probing every word of ``train``/``dev``
    (read sentences with ``.words`` and ``.labels``); ``metric_fn(gold tags, predicted tags)`` is
    the task's metric (None: accuracy)."""
    classes = sorted({label for sentence in train.labels for label in sentence})
    require_classes(classes, "labels")
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted({label for sentence in dev.labels for label in sentence} - set(index))
    if unknown:
        logger.warning("dev labels %s never occur in training; those words count as errors", unknown[:10])
    y_train = np.asarray([index[label] for sentence in train.labels for label in sentence])
    y_dev = np.asarray([index.get(label, -1) for sentence in dev.labels for label in sentence])
    score = _scorer(classes, dev, y_dev, metric_fn)
    n_hidden, seed = encoder.n_hidden_states, run.seed
    distinct = distinct_fusions(run.fusions, n_hidden)
    total = 2 + n_hidden + sum(source == name for name, source in distinct) + int(run.scalar_mix)
    total += n_hidden * ("control_task" in run.controls) + (2 + n_hidden) * ("random_model" in run.controls)
    stages = Stages(run.progress, total)
    with tempfile.TemporaryDirectory(prefix="layerwise-probe-") as scratch, contextlib.closing(stages):
        folder = Path(scratch)
        stages.step("extracting train features")
        f_train = word_sources(encoder, train, run.subword, False, budget=run.budget, folder=folder)
        stages.step("extracting dev features")
        f_dev = word_sources(encoder, dev, run.subword, False, budget=run.budget, folder=folder)
        rows: list[ProbeRow] = []
        for k in range(n_hidden):
            stages.step(f"probe L{k}")
            value, accuracy = score(fit_predict(f_train.layer(k), y_train, f_dev.layer(k), seed=seed))
            rows.append(ProbeRow(f"L{k}", "layer", (k,), value, accuracy))

        def fit_fusion(name: str) -> tuple[float, float]:
            stages.step(f"probe {name}")
            train_x, dev_x = fused(f_train, encoder, name), fused(f_dev, encoder, name)
            return score(fit_predict(train_x, y_train, dev_x, seed=seed))

        rows += fusion_rows(rows, distinct, n_hidden, fit_fusion)
        mix_weights = None
        if run.scalar_mix:
            stages.step("scalar-mix probe")
            mix_row, mix_weights = _mix_row(encoder, f_train, y_train, f_dev, len(classes), score, run)
            rows.append(mix_row)
        if "control_task" in run.controls:
            _control_task(rows, train, dev, f_train, f_dev, seed, stages)
        # free the features before the random model's are extracted
        f_train = f_dev = None  # type: ignore[assignment]
        if "random_model" in run.controls:
            _random_model(rows, encoder, train, dev, y_train, score, run, folder, stages)
    return rows, mix_weights, len(y_train), len(y_dev)


def _scorer(classes: list, dev: Any, y_dev: np.ndarray, metric_fn: Callable | None) -> Score:
    """Predicted classes of every dev word -> (the task's metric, accuracy)."""
    lengths = [len(s) for s in dev.words]

    def score(pred: np.ndarray) -> tuple[float, float]:
        accuracy = float((pred == y_dev).mean())
        if metric_fn is None:
            return accuracy, accuracy
        tags, start = [], 0
        for n in lengths:
            tags.append([classes[p] for p in pred[start : start + n]])
            start += n
        return metric_fn(dev.labels, tags), accuracy

    return score


def _mix_row(
    encoder: Any, f_train: Any, y_train: np.ndarray, f_dev: Any, n_classes: int, score: Score, run: ProbeRun
) -> tuple[ProbeRow, np.ndarray]:
    """The scalar-mix probe's row and weights; it sees every layer at once, so training words are
    subsampled when they would not fit the memory budget."""
    n_hidden = encoder.n_hidden_states
    per_row = n_hidden * encoder.hidden_size * 4
    keep = None
    if f_train.n_rows * per_row > run.budget:
        rng = np.random.default_rng(run.seed)
        keep = np.sort(rng.choice(f_train.n_rows, run.budget // per_row, replace=False))
    all_layers = list(range(n_hidden))
    pred, weights = scalar_mix_probe(
        f_train.layers(all_layers, keep),
        y_train if keep is None else y_train[keep],
        f_dev.layers(all_layers),
        n_classes=n_classes,
        seed=run.seed,
    )
    value, accuracy = score(pred)
    return ProbeRow("scalar_mix", "scalar_mix", tuple(all_layers), value, accuracy), weights


def _control_task(rows, train, dev, f_train, f_dev, seed: int, stages: Stages) -> None:
    """Each layer row's accuracy on the control task (Hewitt & Liang 2019: a random label per
    word type, drawn from the label distribution)."""
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


def _random_model(
    rows, encoder, train, dev, y_train, score: Score, run: ProbeRun, folder: Path, stages: Stages
) -> None:
    """Each layer row's task metric with a randomly initialised model of the same architecture."""
    twin = random_twin(encoder, run.seed, folder / "random-model")
    stages.step("random model: train features")
    r_train = word_sources(twin, train, run.subword, False, budget=run.budget, folder=folder)
    stages.step("random model: dev features")
    r_dev = word_sources(twin, dev, run.subword, False, budget=run.budget, folder=folder)
    for row in rows:
        if row.kind == "layer":
            k = row.layers[0]
            stages.step(f"random model L{k}")
            row.random_model = score(fit_predict(r_train.layer(k), y_train, r_dev.layer(k), seed=run.seed))[0]
