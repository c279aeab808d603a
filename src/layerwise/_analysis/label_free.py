"""Which layer, without labels: the layer metrics of Skean et al., "Layer by Layer: Uncovering
Hidden Representations in Language Models" (ICML 2025), one value per hidden state, all from one
pass over the texts (or over a token-level store, with no model at all).

    prompt_entropy       per text: how spread its tokens are (matrix entropy of their Gram)
    dataset_entropy      over the set: how spread the texts' mean vectors are
    curvature            per text: how sharply its token trajectory turns
    effective_rank       over the set: RankMe (Garrido et al. 2023) of the texts' mean vectors
    intrinsic_dimension  per text: TwoNN dimension of its tokens
    lidar, dime, infonce over augmented views of each text (augment.py: extra forward passes)
    layer_metrics        every metric at once, as a :class:`LayerMetrics` table

Every metric is computed per text or over the whole set, never per mini-batch, so the values do not
depend on the batch size or the order of the texts (the paper's code centres each mini-batch on its
own). What is kept while streaming: running sums for the per-text metrics, and one mean vector per
text and hidden state (n_texts x hidden states x width, float32) for the set-level ones.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, OptionError
from .sources import TokenPassOptions, token_stacks
from .spectra import center_unit, curvature_of, gram_eigenvalues, matrix_entropy, max_entropy, two_nn_states

if TYPE_CHECKING:
    from typing import Unpack

logger = logging.getLogger("layerwise")

# For each metric: does a higher value mark a better layer? The paper's reading of each, fixed before
# any labelled score was looked at (benchmarks/label_free_layers.py measures how well each picks).
# a metric whose values across layers differ by less than this, relative to their size, picks
# nothing: its differences are rounding, not signal
NO_SIGNAL = 1e-5  # rounding left 1.5e-6 (effective rank of duplicates); a random model differs by 5e-5
# fewer distinct texts than this pick no layer: the dataset metrics see one point (NaN entropy), and
# the per-text ones measure one sentence, not the corpus a layer is chosen for
MIN_DISTINCT_TEXTS = 4
HIGHER_IS_BETTER: dict[str, bool] = {
    "prompt_entropy": False,  # compression: intermediate layers discard token-level detail
    "dataset_entropy": True,  # texts spread apart: more of the set's variety kept
    "curvature": False,  # straighter token trajectories (Hosseini & Fedorenko 2023)
    "effective_rank": True,  # RankMe: more dimensions in use
    "intrinsic_dimension": True,  # the high-dimensional abstraction phase (Cheng et al. 2025)
    "lidar": True,  # views of a text together, texts apart
    "dime": True,  # views of a text agree more than random pairs
    "infonce": False,  # a contrastive loss: lower is better
}
ONE_PASS_METRICS = ("prompt_entropy", "dataset_entropy", "curvature", "effective_rank", "intrinsic_dimension")
VIEW_METRICS = ("lidar", "dime", "infonce")
METRICS = ONE_PASS_METRICS + VIEW_METRICS
_DISTANCE_BYTES = 256 * 2**20  # TwoNN's distance matrices held at once, per text


# ---------------------------------------------------------------------------------------------- one pass
@dataclass
class _Running:
    """Sums of the per-text metrics and the texts' mean vectors, filled one text at a time."""

    alpha: float
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    means: list[np.ndarray] = field(default_factory=list)
    layers: tuple[int, ...] | None = None

    def add(self, stack: Any, wanted: set[str]) -> None:
        if self.layers is None:
            self.layers = tuple(stack.layers)
        elif tuple(stack.layers) != self.layers:
            raise InputError(
                f"the stacks hold different hidden states: {self.layers} and {tuple(stack.layers)}"
            )
        hidden = np.asarray(stack.hidden, dtype=np.float64)  # (states, tokens, width)
        self.means.append(hidden.mean(axis=1).astype(np.float32))
        n, d = hidden.shape[1:]
        if "curvature" in wanted and n >= 3:
            self._put("curvature", curvature_of(hidden))  # the states themselves: see curvature()
        if not wanted & {"prompt_entropy", "intrinsic_dimension"}:
            return
        units = center_unit(hidden)  # the paper's per-text normalisation of its tokens
        if "prompt_entropy" in wanted and n >= 2:
            entropy = matrix_entropy(units, self.alpha)
            self._put("prompt_entropy", entropy / max_entropy(n, d))
            self._put("prompt_entropy_raw", entropy)
        if "intrinsic_dimension" in wanted and n >= 4:
            # n x n distances per state: a few states at a time keep a long (windowed) text in bounds
            step = max(1, _DISTANCE_BYTES // (8 * n * n))
            dims = [two_nn_states(units[i : i + step]) for i in range(0, units.shape[0], step)]
            self._put("intrinsic_dimension", np.concatenate(dims))

    def _put(self, name: str, values: np.ndarray) -> None:
        finite = np.isfinite(values)
        self.sums[name] = self.sums.get(name, 0.0) + np.where(finite, values, 0.0)
        self.counts[name] = self.counts.get(name, 0) + finite

    def mean_of(self, name: str) -> np.ndarray:
        if name not in self.sums:
            return np.full(len(self.layers or ()), np.nan)
        return self.sums[name] / np.maximum(self.counts[name], 1) + np.where(self.counts[name] > 0, 0, np.nan)


def set_entropy(means: np.ndarray, alpha: float = 1.0, *, normalized: bool = True) -> np.ndarray:
    """Dataset entropy per hidden state of ``means`` (texts, states, width): the vectors centred on the
    whole set's mean and scaled to unit length, then :func:`spectra.matrix_entropy` of their Gram."""
    x = center_unit(np.asarray(means, dtype=np.float64).transpose(1, 0, 2))
    values = matrix_entropy(x, alpha)
    return values / max_entropy(*x.shape[1:]) if normalized else values


def rankme(means: np.ndarray, eps: float = 1e-7) -> np.ndarray:
    """RankMe per hidden state (Garrido et al. 2023): ``exp(-sum p_k ln p_k)``, p_k = sigma_k / sum sigma
    + eps, of the singular values sigma of the texts' mean vectors as they are (uncentred, as RankMe
    takes an encoder's output matrix)."""
    x = np.asarray(means, dtype=np.float64).transpose(1, 0, 2)
    sigma = np.sqrt(np.maximum(gram_eigenvalues(x, clamp=False), 0.0))  # of the trace-normalised Gram
    p = sigma / sigma.sum(axis=-1, keepdims=True) + eps
    return np.exp(-np.sum(p * np.log(p), axis=-1))


def _one_pass(
    source: Any, texts: Sequence[str] | None, wanted: set[str], alpha: float, reading: TokenPassOptions
) -> tuple[_Running, np.ndarray]:
    running = _Running(alpha)
    for stack in token_stacks(source, texts, **reading):
        running.add(stack, wanted)
    if not running.means:
        raise InputError("nothing to measure: the source holds no texts")
    return running, np.stack(running.means)


# ---------------------------------------------------------------------------------------------- the calls
def prompt_entropy(
    source: Any,
    texts: Sequence[str] | None = None,
    *,
    alpha: float = 1.0,
    normalized: bool = True,
    **reading: Unpack[TokenPassOptions],
) -> np.ndarray:
    """Prompt entropy per hidden state: for each text (of 2 tokens or more), its tokens centred and
    scaled to unit length, the Gram matrix (its d x d dual when tokens outnumber dimensions) with
    negative entries clamped to 0, divided by its trace; the alpha-Renyi entropy of its eigenvalues
    (alpha = 1: von Neumann, nats); ``normalized``: divided by min(ln n_tokens, ln width) as the paper
    plots it; averaged over texts. Every token counts, special tokens included, as in the paper."""
    running, _ = _one_pass(source, texts, {"prompt_entropy"}, alpha, reading)
    return running.mean_of("prompt_entropy" if normalized else "prompt_entropy_raw")


def dataset_entropy(
    source: Any,
    texts: Sequence[str] | None = None,
    *,
    alpha: float = 1.0,
    normalized: bool = True,
    **reading: Unpack[TokenPassOptions],
) -> np.ndarray:
    """Dataset entropy per hidden state: one mean vector per text (all its tokens), the set centred
    on its own mean and each vector scaled to unit length, then the matrix entropy of the set as in
    :func:`prompt_entropy` (normalised by min(ln n_texts, ln width)). Differs from the paper's code,
    which normalises the tokens of each mini-batch together before pooling (its values change with
    the batch size): here the raw states are pooled and the whole set is centred once."""
    _, means = _one_pass(source, texts, set(), alpha, reading)
    return set_entropy(means, alpha, normalized=normalized)


def curvature(
    source: Any, texts: Sequence[str] | None = None, **reading: Unpack[TokenPassOptions]
) -> np.ndarray:
    """Curvature per hidden state (radians): for each text of 3 tokens or more, the mean angle between
    consecutive differences of its token states, ``arccos(|v_k . v_k+1| / (|v_k| |v_k+1|))`` with the
    paper's absolute value; averaged over texts. A straight trajectory has curvature 0. Computed on
    the states as they are, as the paper defines it (after Hosseini & Fedorenko 2023); its code
    centres and unit-scales the tokens first, which folds a straight trajectory onto two points and
    turns its curvature into rounding noise (a test shows it)."""
    running, _ = _one_pass(source, texts, {"curvature"}, 1.0, reading)
    return running.mean_of("curvature")


def effective_rank(
    source: Any, texts: Sequence[str] | None = None, **reading: Unpack[TokenPassOptions]
) -> np.ndarray:
    """RankMe per hidden state (Garrido et al. 2023), from the singular values of the matrix of the
    texts' mean vectors (all tokens), uncentred: between 1 and min(n_texts, width)."""
    _, means = _one_pass(source, texts, set(), 1.0, reading)
    return rankme(means)


def intrinsic_dimension(
    source: Any, texts: Sequence[str] | None = None, **reading: Unpack[TokenPassOptions]
) -> np.ndarray:
    """TwoNN intrinsic dimension per hidden state (Facco et al. 2017): for each text of 4 tokens or
    more, the TwoNN estimate over its tokens (centred and scaled to unit length, as the paper's code
    prepares them); averaged over texts. The paper's code reports 0 for the embeddings (hidden state
    0) without computing it; here it is computed like any other."""
    running, _ = _one_pass(source, texts, {"intrinsic_dimension"}, 1.0, reading)
    return running.mean_of("intrinsic_dimension")


def lidar(
    encoder: Any,
    texts: Sequence[str],
    *,
    views: int = 8,
    seed: int = 0,
    alpha: float = 1.0,
    **reading: Unpack[TokenPassOptions],
) -> np.ndarray:
    """LiDAR per hidden state (Thilak et al. 2024, as Skean et al. compute it): see
    :func:`augment.lidar_of`. ``views`` augmented copies of each text: ``views`` extra forward passes."""
    from .augment import lidar_of, view_means

    return lidar_of(view_means(encoder, texts, views=views, seed=seed, **reading), alpha=alpha)


def dime(
    encoder: Any,
    texts: Sequence[str],
    *,
    seed: int = 0,
    alpha: float = 1.0,
    permutations: int = 10,
    **reading: Unpack[TokenPassOptions],
) -> np.ndarray:
    """DiME per hidden state (Skean et al. 2023): see :func:`augment.dime_of`. Two augmented views of
    each text: two extra forward passes."""
    from .augment import dime_of, view_means

    means = view_means(encoder, texts, views=2, seed=seed, **reading)
    return dime_of(means, alpha=alpha, permutations=permutations, seed=seed)


def infonce(
    encoder: Any,
    texts: Sequence[str],
    *,
    seed: int = 0,
    temperature: float = 0.1,
    **reading: Unpack[TokenPassOptions],
) -> np.ndarray:
    """InfoNCE per hidden state: see :func:`augment.infonce_of`. Two augmented views of each text:
    two extra forward passes."""
    from .augment import infonce_of, view_means

    return infonce_of(view_means(encoder, texts, views=2, seed=seed, **reading), temperature=temperature)


# ---------------------------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class LayerMetrics:
    """Label-free metrics per hidden state: ``values[metric]`` has one value per ``layers`` entry."""

    layers: tuple[int, ...]
    values: dict[str, np.ndarray]
    n_texts: int
    n_distinct: int | None = None  # distinct texts among them (None: not known)

    def best(self, metric: str) -> int:
        """The hidden state a metric picks: its best value (see HIGHER_IS_BETTER) among the layers'
        outputs, hidden states 1.. (the embeddings, state 0, are not contextual)."""
        if self.n_distinct is not None and self.n_distinct < MIN_DISTINCT_TEXTS:
            raise InputError(
                f"{self.n_distinct} distinct text(s) among {self.n_texts}: too few to pick a layer by (give "
                f"at least {MIN_DISTINCT_TEXTS} different texts, ideally hundreds from the corpus to embed)"
            )
        values = np.asarray(self.values[metric], dtype=np.float64)
        candidates = [k for k, layer in enumerate(self.layers) if layer > 0]
        undefined = [self.layers[k] for k in candidates if not np.isfinite(values[k])]
        if undefined:  # a metric undefined at some layer cannot rank that layer against the others
            raise InputError(f"{metric} is undefined (NaN) at hidden state(s) {undefined}: no pick")
        if not candidates:
            raise InputError(f"{metric} has no value for any layer past the embeddings")
        spread = float(np.ptp(values[candidates]))
        if len(candidates) > 1 and spread <= NO_SIGNAL * max(float(np.abs(values[candidates]).max()), 1e-12):
            raise InputError(
                f"{metric} is the same at every layer ({values[candidates[0]]:.6g}, spread {spread:.2g}): no "
                "signal to pick a layer by (duplicate or near-empty texts?)"
            )
        sign = 1.0 if HIGHER_IS_BETTER[metric] else -1.0
        return self.layers[max(candidates, key=lambda k: sign * values[k])]

    def picks(self) -> dict[str, int | None]:
        """Each metric's pick; None for a metric with no signal: no value past the embeddings (texts
        too short), NaN at a layer, the same value at every layer (duplicate texts give effective rank
        1.0000015 everywhere, and a pick by rounding noise), or too few distinct texts."""
        return {name: pick for name, (pick, _) in self._judged().items()}

    def warnings(self) -> list[str]:
        """Why metrics pick nothing (each reason once): what :func:`layer_metrics` logs."""
        return list(dict.fromkeys(why for _, why in self._judged().values() if why))

    def _judged(self) -> dict[str, tuple[int | None, str | None]]:
        out: dict[str, tuple[int | None, str | None]] = {}
        for name in self.values:
            try:
                out[name] = (self.best(name), None)
            except InputError as exc:
                out[name] = (None, str(exc))
        return out

    @classmethod
    def from_dict(cls, table: dict) -> LayerMetrics:
        """The table :meth:`as_dict` wrote (a ``layerwise layers --json`` file, a benchmark record)."""
        values = {
            name: np.asarray([np.nan if v is None else v for v in vals], dtype=np.float64)
            for name, vals in table["metrics"].items()
        }
        distinct = table.get("n_distinct")
        return cls(
            tuple(table["layers"]), values, int(table["n_texts"]), None if distinct is None else int(distinct)
        )

    def as_dict(self) -> dict:
        return {
            "layers": list(self.layers),
            "n_texts": self.n_texts,
            "n_distinct": self.n_distinct,
            "metrics": {
                name: [None if not np.isfinite(v) else float(v) for v in vals]
                for name, vals in self.values.items()
            },
            "best": self.picks(),
        }


def layer_metrics(
    source: Any,
    texts: Sequence[str] | None = None,
    *,
    metrics: str | Iterable[str] = "all",
    alpha: float = 1.0,
    seed: int = 0,
    views: int = 8,
    **reading: Unpack[TokenPassOptions],
) -> LayerMetrics:
    """Every requested metric for every hidden state, from one pass over ``source`` (LayerStacks, a
    token-level store, or an Encoder with ``texts``). ``metrics``: "all" (the view metrics need an
    Encoder and add ``views`` forward passes; without one, "all" means the one-pass metrics), "one-pass",
    or names from METRICS."""
    names = _metric_names(metrics, has_encoder=hasattr(source, "iter_extract"))
    values: dict[str, np.ndarray] = {}
    layers: tuple[int, ...] = ()
    n_texts = len(texts or ())
    n_distinct = len(set(texts)) if texts else None
    if any(name in ONE_PASS_METRICS for name in names):
        running, means = _one_pass(source, texts, set(names), alpha, reading)
        layers, n_texts = running.layers or (), len(means)
        if n_distinct is None:  # a store or stacks: texts whose vectors are the same are the same text
            n_distinct = len(np.unique(means.reshape(len(means), -1), axis=0))
        for name in names:
            if name in ("prompt_entropy", "curvature", "intrinsic_dimension"):
                values[name] = running.mean_of(name)
            elif name == "dataset_entropy":
                values[name] = set_entropy(means, alpha)
            elif name == "effective_rank":
                values[name] = rankme(means)
    viewed = [name for name in names if name in VIEW_METRICS]
    if viewed:
        from .augment import dime_of, infonce_of, lidar_of, view_means

        view_vectors = view_means(
            source, texts or [], views=views if "lidar" in viewed else 2, seed=seed, **reading
        )
        layers = layers or tuple(range(view_vectors.shape[2]))
        if "lidar" in viewed:
            values["lidar"] = lidar_of(view_vectors, alpha=alpha)
        if "dime" in viewed:
            values["dime"] = dime_of(view_vectors[:, :2], alpha=alpha, seed=seed)
        if "infonce" in viewed:
            values["infonce"] = infonce_of(view_vectors[:, :2])
    table = LayerMetrics(layers, {name: values[name] for name in names}, n_texts, n_distinct)
    for why in table.warnings():
        logger.warning("%s", why)
    return table


def _metric_names(metrics: str | Iterable[str], *, has_encoder: bool) -> list[str]:
    if metrics == "all":
        return list(METRICS if has_encoder else ONE_PASS_METRICS)
    if metrics == "one-pass":
        return list(ONE_PASS_METRICS)
    names = [metrics] if isinstance(metrics, str) else list(metrics)
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise OptionError(
            f"unknown metric {unknown[0]!r}; choose from {', '.join(METRICS)}, 'all' or 'one-pass'"
        )
    if not has_encoder and any(n in VIEW_METRICS for n in names):
        raise OptionError(
            f"{', '.join(n for n in names if n in VIEW_METRICS)} compare augmented views of each text, which "
            "needs the model: pass an Encoder and texts, or leave them out"
        )
    return names
