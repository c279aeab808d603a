"""``lw.analyze``: how representations change from layer to layer, which layer to try without
labels, and the HTML report and word-projection plots of ``layerwise analyze`` and ``layerwise plot``.

    import layerwise as lw
    lw.analyze.layer_similarity(stacks)              # linear CKA between every pair of layers
    lw.analyze.layer_metrics(enc, texts)             # the label-free metrics, every hidden state
    lw.analyze.write_report(stacks, "report.html")   # everything at once, as one page

The arithmetic lives in the internal package ``layerwise._analysis`` (analysis guide); this module is
its public face.
"""

from __future__ import annotations

from ._analysis.label_free import (
    LayerMetrics,
    curvature,
    dataset_entropy,
    dime,
    effective_rank,
    infonce,
    intrinsic_dimension,
    layer_metrics,
    lidar,
    prompt_entropy,
)
from ._analysis.plot import plot_word_projections
from ._analysis.report import write_report
from ._analysis.stats import (
    anisotropy,
    drift,
    intra_sentence_similarity,
    layer_matrix,
    layer_similarity,
    linear_cka,
    self_similarity,
)

__all__ = [
    "LayerMetrics",
    "anisotropy",
    "curvature",
    "dataset_entropy",
    "dime",
    "drift",
    "effective_rank",
    "infonce",
    "intra_sentence_similarity",
    "intrinsic_dimension",
    "layer_matrix",
    "layer_metrics",
    "layer_similarity",
    "lidar",
    "linear_cka",
    "plot_word_projections",
    "prompt_entropy",
    "self_similarity",
    "write_report",
]
