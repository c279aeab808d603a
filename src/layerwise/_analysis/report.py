"""``layerwise analyze``: one self-contained HTML report of how a model's layers differ on your texts.

The report embeds its figures (PNG as data URIs), explains each statistic in a sentence or two,
gives the numbers in tables, and states the model and settings, so it can be mailed or archived
as one file. The figures, a stats.json and the report land in the output folder.
"""

from __future__ import annotations

import base64
import html
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._features.pool import pool_words
from .._results import LayerStack
from .._version import __version__
from ..errors import InputError, check_choice
from .label_free import HIGHER_IS_BETTER, LayerMetrics, layer_metrics
from .plot import plot_heatmap, plot_lines, plot_projections
from .stats import anisotropy, drift, intra_sentence_similarity, layer_similarity, self_similarity

STOPWORDS = set(
    "the a an and or but of to in on at for with by from as is are was were be been it its this that these those "
    "i you he she we they me him her us them my your his our their not no do does did have has had will would can "
    "could should may might must there here what which who whom when where why how all any some so than then too "
    "very just also if into out up down over about after before".split()
)


def frequent_words(word_lists: Sequence[Sequence[str]], n: int = 6, min_count: int = 3) -> list[str]:
    """The ``n`` most frequent alphabetic non-stopwords seen at least ``min_count`` times."""
    counts = Counter(w.lower() for words in word_lists for w in words if w.isalpha() and len(w) > 2)
    return [w for w, c in counts.most_common() if w not in STOPWORDS and c >= min_count][:n]


def _figure(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(path.stem)}">'


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        if isinstance(value, float):
            return "–" if np.isnan(value) else f"{value:.3f}"
        return html.escape(str(value))

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:980px;margin:2rem auto;padding:0 1rem;
color:#1d1d1f;line-height:1.5}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
.meta{color:#555;font-size:.92rem}.explain{color:#333;background:#f6f8fa;border-left:3px solid #4c8bf5;padding:.5rem .8rem}
img{max-width:100%;height:auto;display:block;margin:.8rem 0}
table{border-collapse:collapse;font-size:.88rem;margin:.6rem 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:.25rem .55rem;text-align:right}th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}
code{background:#f0f0f0;padding:0 .2rem;border-radius:3px}
"""


@dataclass
class _Measures:
    """The report's statistics of one set of texts, every layer."""

    layers: tuple[int, ...]
    word_vectors: list
    chosen: list[str]  # the words whose contexts are compared
    cka: np.ndarray
    cosine: np.ndarray
    moves: dict
    aniso: np.ndarray
    intra: np.ndarray
    selfsim: dict
    n_tokens: int
    label_free: LayerMetrics


def write_report(
    stacks: Sequence[LayerStack],
    folder: str | Path,
    *,
    model: str,
    max_length: int | None = None,
    words: Sequence[str] | None = None,
    projection: str = "pca",
    max_rows: int = 20000,
    source: str | None = None,
    kind: str = "encoder",
    settings: dict | None = None,
) -> Path:
    """Analyse ``stacks`` (every layer of each text, e.g. ``enc.extract(texts, long_texts="window")``)
    and write ``folder/report.html`` (plus figures and stats.json). ``model`` and ``max_length``
    are shown in the report's settings; ``kind`` ("encoder" or "decoder") picks the layer
    recommendation's rule; ``settings``: the Encoder's (``enc.settings.as_dict()``), recorded in
    stats.json's ``made`` with the version and the source, as every layerwise output records them."""
    from .plot import PROJECTIONS

    started = time.perf_counter()
    check_choice("projection", projection, PROJECTIONS)
    stacks = [s for s in stacks if s.text.strip()]
    if len(stacks) < 2:
        raise InputError("the analysis needs at least two non-empty texts")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"report folder {str(folder)!r} is a file; choose a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the report folder {str(folder)!r}: {exc.strerror}") from exc
    m = _measure(stacks, words, max_rows)
    figures = _draw(m, folder, projection)
    stats = {
        "model": model,
        "layers": list(m.layers),
        "n_texts": len(stacks),
        "n_tokens": m.n_tokens,
        "words": m.chosen,
        "cka": m.cka.tolist(),
        "cosine": m.cosine.tolist(),
        "drift": {k: np.asarray(v).tolist() for k, v in m.moves.items()},
        "anisotropy": m.aniso.tolist(),
        "intra_sentence_similarity": m.intra.tolist(),
        "self_similarity": {w: v.tolist() for w, v in m.selfsim.items()},
        "label_free": m.label_free.as_dict(),
        "layerwise_version": __version__,
        "made": {
            "layerwise": __version__,
            "settings": settings or {"model": model, "max_length": max_length},
            "source": source,
            "projection": projection,
            "words": list(words) if words else None,
        },
    }
    (folder / "stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    seconds = time.perf_counter() - started
    sections = [
        f"<h1>Layer report: {html.escape(model)}</h1>",
        f'<p class="meta">{len(stacks)} texts, {m.n_tokens} tokens, {len(m.layers)} hidden states (0 = embedding '
        f"output). Source: <code>{html.escape(source or 'in-memory texts')}</code>. layerwise {__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}, {seconds:.1f} s.</p>",
        *_layer_sections(m, figures),
        *label_free_section(m.label_free, figures, kind),
        *_word_sections(m, figures, projection),
        '<h2>Settings</h2><p class="meta">'
        + html.escape(
            f"model {model}; max length {max_length}; long texts: sliding windows; "
            f"words: mean of their wordpieces; statistics on up to {max_rows} sampled rows; "
            f"projection: {projection}."
        )
        + "</p>",
    ]
    page = f"<!doctype html><html lang=en><head><meta charset=utf-8><title>layerwise report: {html.escape(model)}</title><style>{CSS}</style></head><body>{''.join(sections)}</body></html>"
    report = folder / "report.html"
    report.write_text(page, encoding="utf-8")
    return report


def _measure(stacks: Sequence[LayerStack], words: Sequence[str] | None, max_rows: int) -> _Measures:
    word_vectors = [pool_words(s, "mean") for s in stacks]
    chosen = list(words) if words else frequent_words([w.words for w in word_vectors])
    return _Measures(
        layers=stacks[0].layers,
        word_vectors=word_vectors,
        chosen=chosen,
        cka=layer_similarity(stacks, "cka", max_rows=max_rows),
        cosine=layer_similarity(stacks, "cosine", max_rows=max_rows),
        moves=drift(stacks, max_rows=max_rows),
        aniso=anisotropy(stacks, max_rows=max_rows),
        intra=intra_sentence_similarity(word_vectors),
        selfsim=self_similarity(word_vectors, chosen) if chosen else {},
        n_tokens=sum(s.n_tokens for s in stacks),
        label_free=layer_metrics(stacks, metrics="one-pass"),
    )


def _draw(m: _Measures, folder: Path, projection: str) -> dict[str, Path]:
    """Every figure of the report, as PNG files in ``folder``, by name."""
    layers = m.layers
    figures = {
        "cka": plot_heatmap(m.cka, layers, folder / "cka.png", title="Linear CKA between layers (tokens)"),
        "cosine": plot_heatmap(
            m.cosine, layers, folder / "cosine.png", title="Mean cosine between layers (same token)"
        ),
        "drift": plot_lines(
            {"mean cos(h_l, h_l-1)": m.moves["cosine"]},
            list(m.moves["layers"]),
            folder / "drift.png",
            title="How much each layer changes a token",
            ylabel="cosine to previous layer",
            xlabel="layer l (compared with layer l-1)",
        ),
        "isotropy": plot_lines(
            {"anisotropy (random pairs)": m.aniso, "intra-sentence (adjusted)": m.intra},
            layers,
            folder / "isotropy.png",
            title="Anisotropy and intra-sentence similarity",
            ylabel="cosine",
        ),
    }
    picks = m.label_free.picks()
    for name, values in m.label_free.values.items():
        figures[name] = plot_lines(
            {name.replace("_", " "): values},
            layers,
            folder / f"{name}.png",
            best=picks[name],
            title=f"{name.replace('_', ' ').capitalize()} ({'higher' if HIGHER_IS_BETTER[name] else 'lower'} "
            "is better; the star marks the pick)",
            ylabel=name.replace("_", " "),
        )
    if not m.selfsim:
        return figures
    figures["self"] = plot_lines(
        m.selfsim,
        layers,
        folder / "self_similarity.png",
        title="Self-similarity across contexts (adjusted)",
        ylabel="cosine - anisotropy",
    )
    points, labels = [], []
    for item in m.word_vectors:
        for j, w in enumerate(item.words):
            if w.lower() in m.chosen:
                points.append(item.vectors[:, j])
                labels.append(w.lower())
    if len(points) >= 3:
        figures["projection"] = plot_projections(
            np.stack(points, axis=1),
            labels,
            layers,
            folder / "projection.png",
            projection=projection,  # type: ignore[arg-type]
            title=f"{projection.upper()} of the chosen words' vectors, one panel per layer",
        )
    return figures


def _layer_sections(m: _Measures, figures: dict[str, Path]) -> list[str]:
    """How similar the layers are, and how much each changes a token: explained, drawn, tabled."""
    layers, moves = m.layers, m.moves
    per_layer = [
        [
            f"L{layer}",
            m.aniso[k],
            m.intra[k],
            *(moves["cosine"][k - 1] if k else float("nan"),),
            *(moves["distance"][k - 1] if k else float("nan"),),
        ]
        for k, layer in enumerate(layers)
    ]
    return [
        "<h2>How similar are the layers to each other?</h2>",
        '<p class="explain"><b>Linear CKA</b> (centred kernel alignment, Kornblith et al. 2019) compares two layers '
        "over all tokens at once: 1 means one layer is a rotation and rescaling of the other, values near 0 mean "
        "they encode unrelated structure. The <b>cosine</b> map compares the same token's vector in two layers.</p>",
        _figure(figures["cka"]),
        _table(
            ["layer", *[f"L{i}" for i in layers]],
            [[f"L{i}", *m.cka[k].tolist()] for k, i in enumerate(layers)],
        ),
        _figure(figures["cosine"]),
        "<h2>How much does each layer change a token?</h2>",
        '<p class="explain"><b>Drift</b>: the mean cosine between a token\'s vector after layer <i>l</i> and after '
        "layer <i>l</i>−1 (1 = unchanged), and the mean length of the change. <b>Anisotropy</b>: the mean cosine "
        "of two random tokens; 0 for directions spread evenly, higher when all vectors share a direction "
        "(Ethayarajh 2019). <b>Intra-sentence similarity</b>: how close words sit to their sentence's mean "
        "vector, minus the anisotropy.</p>",
        _figure(figures["drift"]),
        _figure(figures["isotropy"]),
        _table(
            ["layer", "anisotropy", "intra-sentence (adj.)", "cos to previous", "distance to previous"],
            per_layer,
        ),
    ]


def _word_sections(m: _Measures, figures: dict[str, Path], projection: str) -> list[str]:
    """Whether the same words drift apart in different contexts (none without chosen words)."""
    if not m.selfsim:
        return []
    sections = [
        "<h2>Do the same words drift apart in different contexts?</h2>",
        '<p class="explain"><b>Self-similarity</b>: the mean cosine between one word\'s vectors in different '
        "contexts, minus the anisotropy (Ethayarajh 2019). High means the layer represents the word the same "
        "way everywhere; lower values mean more context-specific vectors.</p>",
        _figure(figures["self"]),
        _table(["word", *[f"L{i}" for i in m.layers]], [[w, *v.tolist()] for w, v in m.selfsim.items()]),
    ]
    if "projection" in figures:
        sections += [
            f'<p class="explain">Each point is one occurrence of a chosen word, projected to 2-D with '
            f"{projection.upper()} separately in every layer; colours are words.</p>",
            _figure(figures["projection"]),
        ]
    return sections


EXPLAINED = {
    "prompt_entropy": "how evenly a text's tokens spread over directions (matrix entropy of their Gram "
    "matrix, 1 = as spread as possible); low values mean the layer compresses the text",
    "dataset_entropy": "the same over the texts' mean vectors: how far apart the layer keeps different texts",
    "curvature": "the mean angle (radians) between consecutive steps of a text's token trajectory; "
    "straighter trajectories are easier to extrapolate",
    "effective_rank": "RankMe: how many dimensions the texts' mean vectors really use",
    "intrinsic_dimension": "TwoNN: the dimension of the surface a text's tokens lie on",
}


def label_free_section(metrics: LayerMetrics, figures: dict, kind: str = "encoder") -> list[str]:
    """The report's "which layer, without labels" section: a sentence per metric, its figure with
    the pick marked, a table, and the layer ``layerwise layers`` would recommend."""
    from .layer_choice import recommend

    choice = recommend(metrics, kind=kind)
    names = list(metrics.values)
    parts = [
        "<h2>Which layer, without labels?</h2>",
        '<p class="explain">Label-free metrics of Skean et al., "Layer by Layer" (ICML 2025), one value per '
        "hidden state; each figure marks the layer the metric picks (its best value past the embeddings). "
        + " ".join(f"<b>{n.replace('_', ' ').capitalize()}</b>: {html.escape(EXPLAINED[n])}." for n in names)
        + "</p>",
        f'<p class="meta"><b>{html.escape(str(choice))}</b></p>',
    ]
    parts += [_figure(figures[name]) for name in names]
    rows = [[f"L{layer}", *[metrics.values[n][k] for n in names]] for k, layer in enumerate(metrics.layers)]
    parts.append(_table(["layer", *[n.replace("_", " ") for n in names]], rows))
    return parts
