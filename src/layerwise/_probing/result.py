"""How a probe runs (ProbeRun) and what it finds: one row per layer or fusion, the table, the JSON
and the per-layer curve."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .._features.names import SubwordPool
from ..errors import MissingDependencyError


@dataclass(frozen=True)
class ProbeRun:
    """How one probe runs, whatever its task: the fusions probed besides every layer, the controls,
    the scalar mix, the subword pooling of a word's features (token tasks), the seed, the progress
    bar and the memory budget of word features in bytes (token tasks; above it they go through a
    store on disk)."""

    fusions: Sequence[str]
    controls: Sequence[str]
    scalar_mix: bool
    subword: SubwordPool
    seed: int
    progress: bool | None
    budget: int


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
    unit: str = "examples"  # what n_train and n_dev count: words, sentences or pairs
    n_sentences: tuple[int, int] | None = None  # the train and dev sentences a word task's words are in

    @property
    def sizes(self) -> str:
        """The data in its units: "7,027 train / 1,210 dev words from 300 / 50 sentences"."""
        if self.n_train == 0:  # pairs: scored without training
            return f"{self.n_dev:,} {self.unit}"
        said = f"{self.n_train:,} train / {self.n_dev:,} dev {self.unit}"
        if self.n_sentences is not None:
            said += f" from {self.n_sentences[0]:,} / {self.n_sentences[1]:,} sentences"
        return said

    @property
    def best(self) -> ProbeRow:
        """The row with the highest score; a NaN score (e.g. constant features) is never best."""
        return max(self.rows, key=lambda r: -math.inf if math.isnan(r.score) else r.score)

    @property
    def selectivity_metric(self) -> str | None:
        """What selectivity is computed on: control tasks predict per-token classes, so always
        token accuracy, even when the main metric is entity F1."""
        return "accuracy" if any(r.control_task is not None for r in self.rows) else None

    def layer_rows(self) -> list[ProbeRow]:
        return [r for r in self.rows if r.kind == "layer"]

    def to_dict(self) -> dict:
        data = asdict(self)
        for row, raw in zip(self.rows, data["rows"], strict=True):
            raw["selectivity"] = row.selectivity
            raw["best"] = row is self.best
        data["selectivity_metric"] = self.selectivity_metric
        return _json_safe(data)

    def to_json(self, path: str | os.PathLike) -> None:
        """The numbers as strict JSON: an undefined score (NaN) is written as null."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n", encoding="utf-8")

    def table(self):
        """A rich Table: one row per layer, fusion and the scalar mix; the best marked."""
        from rich.table import Table

        table = Table(
            title=f"{self.task} probe, {self.model}: {self.metric} on dev ({self.sizes})",
            caption=self._caption(),
            caption_justify="left",
        )
        table.add_column("features")
        table.add_column(self.metric, justify="right")
        # entity F1 beside the token accuracy that the controls and selectivity are measured on
        token_accuracy = self.metric != "accuracy" and any(r.accuracy is not None for r in self.rows)
        if token_accuracy:
            table.add_column("token accuracy", justify="right")
        if any(r.random_model is not None for r in self.rows):
            table.add_column("random model", justify="right")
        if any(r.control_task is not None for r in self.rows):
            table.add_column("control task", justify="right")
            header = "selectivity (accuracy)" if token_accuracy else "selectivity"
            table.add_column(header, justify="right")
        best = self.best
        for i, row in enumerate(self.rows):
            last_of_kind = i + 1 == len(self.rows) or self.rows[i + 1].kind != row.kind
            cells = [row.name + (" ◀ best" if row is best else ""), _percent(row.score)]
            if token_accuracy:
                cells.append(_percent(row.accuracy))
            if any(r.random_model is not None for r in self.rows):
                cells.append(_percent(row.random_model))
            if any(r.control_task is not None for r in self.rows):
                cells.append(_percent(row.control_task))
                cells.append(_percent(row.selectivity))
            table.add_row(*cells, style="bold" if row is best else None, end_section=last_of_kind)
        return table

    def _caption(self) -> str:
        parts = ["Lk = hidden state k (L0 = embeddings)."]
        if self.scalar_mix_weights is not None:
            weights = ", ".join(f"{w:.2f}" for w in self.scalar_mix_weights)
            parts.append(f"Scalar mix weights: [{weights}], centre of gravity {self.center_of_gravity:.2f}.")
        if any(r.control_task is not None for r in self.rows):
            parts.append(
                "Selectivity = token accuracy - control-task token accuracy (Hewitt & Liang 2019)"
                + (f", not {self.metric}." if self.metric != "accuracy" else ".")
            )
        if any(math.isnan(r.score) for r in self.rows):
            parts.append("n/a: the score is undefined (e.g. features that do not vary).")
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
            ax.plot(
                x,
                [100 * (r.random_model or 0) for r in layers],
                "s--",
                color="#7f7f7f",
                label="random-model control",
            )
        if any(r.control_task is not None for r in layers):
            ax.plot(
                x,
                [100 * (r.selectivity or 0) for r in layers],
                "^:",
                color="#2ca02c",
                label="selectivity (vs control task)",
            )
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


def _percent(value: float | None) -> str:
    if value is None:
        return ""
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}"


def _json_safe(value):
    """NaN/inf become None so the JSON is strict (bare NaN is not JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value
