"""Layer-wise probing: which layer, which fusion? Answered with numbers on your own data.

For every hidden state and every named fusion (the BERT paper's Table 7 rows), a linear probe
(scikit-learn logistic regression on standardised features, fixed seed) is trained on frozen
features and scored on the dev set; all features come from one extraction pass. A scalar-mix
probe learns softmax weights over the layers (Tenney et al. 2019 read them as "where the
information sits": the centre of gravity). Two controls say whether a number means anything:

* random model: the same probe on a randomly initialised model of the same architecture;
* control task (Hewitt & Liang 2019): every word type gets a random label drawn from the label
  distribution; selectivity = task accuracy - control accuracy. High selectivity means the probe
  reads the representation rather than memorising word identities.

Tasks: ``conllu`` (UPOS/XPOS/deprel per word, accuracy), ``conll`` (CoNLL-2003 NER, entity F1 with
BIO decoding), ``tsv`` (sentence classification, accuracy), ``pairs`` (sentence-pair similarity:
cosine of sentence vectors against gold scores, Spearman; nothing is trained).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from .errors import InputError, MissingDependencyError, OptionError, check_choice
from .fuse import NAMED_FUSIONS, fuse_layers, fusion_layers
from .tasks import TaggedSentences, entity_f1, read_conll2003, read_conllu, read_table

if TYPE_CHECKING:
    from .encoder import Encoder

logger = logging.getLogger("layerwise")

Task = Literal["conllu", "conll", "tsv", "pairs"]
TASKS: tuple[str, ...] = ("conllu", "conll", "tsv", "pairs")
TABLE7_FUSIONS: tuple[str, ...] = tuple(NAMED_FUSIONS)


def _require_sklearn() -> None:
    try:
        import scipy  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(
            "probing needs scikit-learn and scipy: pip install 'layerwise[probe]'"
        ) from exc


@dataclass
class ProbeRow:
    """One row of the probe table: a hidden state, a fusion or the scalar mix."""

    name: str
    kind: str  # "layer" | "fusion" | "scalar_mix"
    layers: tuple[int, ...]
    score: float
    accuracy: float | None = None
    random_model: float | None = None
    control_task: float | None = None

    @property
    def selectivity(self) -> float | None:
        if self.control_task is None or self.accuracy is None:
            return None
        return self.accuracy - self.control_task


@dataclass
class ProbeResult:
    task: str
    metric: str
    model: str
    rows: list[ProbeRow]
    n_train: int
    n_dev: int
    seconds: float
    scalar_mix_weights: list[float] | None = None
    center_of_gravity: float | None = None
    settings: dict = field(default_factory=dict)

    @property
    def best(self) -> ProbeRow:
        return max(self.rows, key=lambda r: r.score)

    def layer_rows(self) -> list[ProbeRow]:
        return [r for r in self.rows if r.kind == "layer"]

    def to_dict(self) -> dict:
        data = asdict(self)
        for row, raw in zip(self.rows, data["rows"], strict=True):
            raw["selectivity"] = row.selectivity
            raw["best"] = row is self.best
        return data

    def to_json(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    def table(self):
        """A rich Table: one row per layer, fusion and the scalar mix; the best marked."""
        from rich.table import Table

        table = Table(
            title=f"{self.task} probe, {self.model}: {self.metric} on dev "
            f"({self.n_train} train / {self.n_dev} dev)",
            caption=self._caption(),
            caption_justify="left",
        )
        table.add_column("features")
        table.add_column(self.metric, justify="right")
        if any(r.random_model is not None for r in self.rows):
            table.add_column("random model", justify="right")
        if any(r.control_task is not None for r in self.rows):
            table.add_column("control task", justify="right")
            table.add_column("selectivity", justify="right")
        best = self.best
        for i, row in enumerate(self.rows):
            last_of_kind = i + 1 == len(self.rows) or self.rows[i + 1].kind != row.kind
            cells = [row.name + (" ◀ best" if row is best else ""), f"{100 * row.score:.1f}"]
            if any(r.random_model is not None for r in self.rows):
                cells.append("" if row.random_model is None else f"{100 * row.random_model:.1f}")
            if any(r.control_task is not None for r in self.rows):
                cells.append("" if row.control_task is None else f"{100 * row.control_task:.1f}")
                cells.append("" if row.selectivity is None else f"{100 * row.selectivity:.1f}")
            table.add_row(*cells, style="bold" if row is best else None, end_section=last_of_kind)
        return table

    def _caption(self) -> str:
        parts = ["Lk = hidden state k (L0 = embeddings)."]
        if self.scalar_mix_weights is not None:
            weights = ", ".join(f"{w:.2f}" for w in self.scalar_mix_weights)
            parts.append(f"Scalar mix weights: [{weights}], centre of gravity {self.center_of_gravity:.2f}.")
        if any(r.control_task is not None for r in self.rows):
            parts.append("Selectivity = accuracy - control-task accuracy (Hewitt & Liang 2019).")
        return " ".join(parts)

    def plot(self, path: str | os.PathLike) -> None:
        """The per-layer curve with the controls and the best fusion, as a PNG/SVG/PDF."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise MissingDependencyError("plots need matplotlib: pip install 'layerwise[plot]'") from exc
        layers = self.layer_rows()
        x = [r.layers[0] for r in layers]
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
        ax.plot(
            x, [100 * r.score for r in layers], "o-", color="#1f77b4", lw=2, label=f"{self.metric} (probe)"
        )
        if any(r.random_model is not None for r in layers):
            ax.plot(x, [100 * (r.random_model or 0) for r in layers], "s--", color="#7f7f7f",
                    label="random-model control")  # fmt: skip
        if any(r.control_task is not None for r in layers):
            ax.plot(x, [100 * (r.selectivity or 0) for r in layers], "^:", color="#2ca02c",
                    label="selectivity (vs control task)")  # fmt: skip
        fusions = [r for r in self.rows if r.kind != "layer"]
        if fusions:
            top = max(fusions, key=lambda r: r.score)
            ax.axhline(100 * top.score, color="#d62728", lw=1, ls="-.", label=f"best fusion: {top.name}")
        ax.set_xlabel("hidden state (0 = embeddings)")
        ax.set_ylabel(f"{self.metric} (%)")
        ax.set_xticks(x)
        ax.set_title(f"{self.task} probe per layer: {self.model}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


# ---------------------------------------------------------------------------------------------- probes
def standardize(train: np.ndarray, dev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = train.mean(axis=0, dtype=np.float64)
    std = train.std(axis=0, dtype=np.float64)
    std[std == 0] = 1.0
    return ((train - mean) / std).astype(np.float32), ((dev - mean) / std).astype(np.float32)


def fit_predict(
    x_train: np.ndarray, y_train: np.ndarray, x_dev: np.ndarray, *, seed: int, max_iter: int = 100
) -> np.ndarray:
    """Multinomial logistic regression (L-BFGS, at most ``max_iter`` iterations: dev accuracy
    settles by 50 on UD EWT) on standardised features; dev predictions."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    if len(np.unique(y_train)) < 2:
        return np.full(len(x_dev), y_train[0])
    a, b = standardize(x_train, x_dev)
    model = LogisticRegression(max_iter=max_iter, C=1.0, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(a, y_train)
    return model.predict(b)


def scalar_mix_probe(
    train: np.ndarray, y_train: np.ndarray, dev: np.ndarray, *, n_classes: int, seed: int, epochs: int = 300
) -> tuple[np.ndarray, np.ndarray]:
    """Train ScalarMix + linear softmax on ``(n_layers, n, dim)`` features; (dev predictions, weights)."""
    import torch

    from .scalar_mix import ScalarMix

    torch.manual_seed(seed)
    layers = train.shape[0]
    a = np.empty_like(train)
    b = np.empty_like(dev)
    for k in range(layers):
        a[k], b[k] = standardize(train[k], dev[k])
    xa, xb = torch.from_numpy(a), torch.from_numpy(b)
    ya = torch.from_numpy(y_train.astype(np.int64))
    mix = ScalarMix(layers)
    head = torch.nn.Linear(train.shape[2], n_classes)
    optimizer = torch.optim.Adam([*mix.parameters(), *head.parameters()], lr=0.05, weight_decay=0.0)
    for _ in range(epochs):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(head(mix(xa)), ya)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        predictions = head(mix(xb)).argmax(-1).numpy()
    return predictions, mix.normalized_weights().detach().numpy()


def control_labels(
    words: Sequence[Sequence[str]], labels: Sequence[Sequence[str]], all_words, seed: int
) -> dict[str, str]:
    """Hewitt & Liang's control task: each word type (lower-cased) gets a label drawn from the
    empirical label distribution, fixed by ``seed``."""
    values, counts = np.unique([label for sentence in labels for label in sentence], return_counts=True)
    types = sorted({w.lower() for sentence in all_words for w in sentence})
    rng = np.random.default_rng(seed)
    drawn = rng.choice(values, size=len(types), p=counts / counts.sum())
    return dict(zip(types, drawn.tolist(), strict=True))


# ---------------------------------------------------------------------------------------------- features
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


def available_memory() -> int:
    """Bytes of memory available to this process (MemAvailable), or 8 GiB when unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30


def word_sources(
    encoder: Encoder,
    sentences: TaggedSentences,
    subword: str,
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
    from .store import extract_to_store, open_store

    logger.info(
        "features need %.1f GiB > budget %.1f GiB: going through a store in %s",
        need / 2**30,
        budget / 2**30,
        folder,
    )
    path = folder / f"words-{len(list(folder.iterdir()))}.lw"
    extract_to_store(encoder, [" ".join(w) for w in sentences.words], path, pool=f"word:{subword}",
                     long_texts="window", dtype="float32", progress=progress)  # fmt: skip
    store = open_store(path)
    if store.n_rows != n_words:
        raise InputError("the tokenizer splits some words differently when they are joined with spaces; "
                         "pass a larger memory budget to keep the features in memory")  # fmt: skip
    return LayerSource(store=store)


def word_features(
    encoder: Encoder, sentences: TaggedSentences, subword: str, progress: bool | None
) -> np.ndarray:
    """``(n_layers, n_words, hidden)`` word vectors of every word of every sentence."""
    vectors = encoder.embed_words(
        sentences.words, subword=subword, layers="all", long_texts="window", progress=progress
    )  # type: ignore[arg-type]
    kept = [v.n_words for v in vectors]
    lost = sum(len(w) - k for w, k in zip(sentences.words, kept, strict=True))
    if lost:
        raise InputError(f"{lost} words produced no wordpieces; remove empty words from the data")
    return np.concatenate([v.vectors for v in vectors], axis=1)


def _fused(source: LayerSource, encoder: Encoder, name: str, rows: np.ndarray | None = None) -> np.ndarray:
    wanted = fusion_layers(name, encoder.n_hidden_states)
    picked = source.layers(wanted, rows)
    return fuse_layers(picked, wanted, name, n_hidden_states=encoder.n_hidden_states, axis=0)


def _distinct_fusions(fusions: Sequence[str], n_hidden: int) -> list[tuple[str, int | str]]:
    """Each fusion with what its probe equals: a layer index (single-layer fusions), the name of an
    earlier fusion over the same layers (a mean equals a sum after standardisation), or itself."""
    out: list[tuple[str, int | str]] = []
    seen: dict[tuple, str] = {}
    for name in fusions:
        layers = fusion_layers(name, n_hidden)
        operation = NAMED_FUSIONS[name][1] if name in NAMED_FUSIONS else name
        if operation == "select":
            out.append((name, layers[0]))
            continue
        key = (tuple(layers), "concat" if operation == "concat" else "sum")
        out.append((name, seen.setdefault(key, name)))
    return out


def _fusion_rows(
    layer_rows: Sequence[ProbeRow],
    distinct: Sequence[tuple[str, int | str]],
    n_hidden: int,
    fit_fusion,
) -> list[ProbeRow]:
    """Rows for the fusions in ``distinct`` (see :func:`_distinct_fusions`): a single-layer fusion
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
        out.append(ProbeRow(name, "fusion", fusion_layers(name, n_hidden), value, accuracy))
    return out


def random_twin(encoder: Encoder, seed: int, folder: Path) -> Encoder:
    """A randomly initialised model with the same architecture and tokenizer."""
    import torch
    from transformers import AutoModel

    from .encoder import Encoder

    torch.manual_seed(seed)
    model = AutoModel.from_config(encoder.model.config)
    model.save_pretrained(folder)
    encoder.tokenizer.save_pretrained(folder)
    return Encoder(folder, device=encoder.device, max_length=encoder.max_length)


# ---------------------------------------------------------------------------------------------- tasks
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
    subword: str = "first",
    fusions: Sequence[str] = TABLE7_FUSIONS,
    controls: Sequence[str] = ("random_model", "control_task"),
    scalar_mix: bool = True,
    seed: int = 0,
    memory_budget: int | None = None,
    progress: bool | None = None,
) -> ProbeResult:
    """Probe every layer and fusion of ``encoder`` (or ``model``) on a task; see the module docs.

    ``train``/``dev`` files for conllu, conll and tsv; ``data`` for pairs. ``column`` picks the
    label column (conllu: upos, xpos, deprel…; conll: ner, pos, chunk). Word features larger
    than ``memory_budget`` bytes (default: half the available memory) go through a store on disk."""
    _require_sklearn()
    check_choice("task", task, TASKS)
    for control in controls:
        check_choice("controls item", control, ("random_model", "control_task"))
    started = time.perf_counter()
    if encoder is None:
        from .encoder import Encoder

        encoder = Encoder(model)
    fusions = tuple(fusions)
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
        try:
            scores = [float(s) for s in table[score_column]]
        except ValueError as exc:
            raise InputError(f"{source}: column {score_column!r} must hold numbers ({exc})") from None
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
