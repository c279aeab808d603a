"""One answer to "which layer should I try first?", from the label-free metrics of the user's texts
and from how well each rule has picked on labelled data (benchmarks/label_free_layers.py writes
data/label_free_rules.json: the mean regret of every rule over its models and tasks).

The rule is the one with the lowest mean regret on that benchmark, whichever it is: a metric's pick,
or a rule that needs no metric (the middle layer, the last layer)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

from .label_free import HIGHER_IS_BETTER, LayerMetrics

MIDDLE, LAST = "middle (L/2)", "last (L)"


@cache
def benchmark_rules() -> dict:
    """The benchmark's summary: ``rules`` (rule -> mean_regret_points, within_one_point), ``ranked``
    (best rule first) and ``cases`` (model x task pairs it was measured on)."""
    text = resources.files("layerwise.analysis").joinpath("data/label_free_rules.json").read_text("utf-8")
    return json.loads(text)


def rule_in_words(rule: str) -> str:
    if rule == MIDDLE:
        return "the middle layer (hidden state L/2)"
    if rule == LAST:
        return "the last layer"
    return f"the layer with the {'highest' if HIGHER_IS_BETTER[rule] else 'lowest'} {rule.replace('_', ' ')}"


def layer_by_rule(metrics: LayerMetrics, rule: str, picks: dict[str, int | None] | None = None) -> int | None:
    """The hidden state ``rule`` picks, or None when the rule's metric was not computed (or has no
    value). ``picks``: ``metrics.picks()`` when the caller has it already."""
    last = metrics.layers[-1]
    if rule == MIDDLE:
        return round(last / 2)
    if rule == LAST:
        return last
    return (metrics.picks() if picks is None else picks).get(rule)


@dataclass(frozen=True)
class Recommendation:
    layer: int
    rule: str
    reason: str

    def __str__(self) -> str:
        return f"Try hidden state {self.layer} first: {self.reason}"


def recommend(metrics: LayerMetrics) -> Recommendation:
    """The layer to try first and why, by the rule that has picked best on the benchmark."""
    summary = benchmark_rules()
    rules = summary["rules"]
    picks = metrics.picks()
    for rule in summary["ranked"]:
        layer = layer_by_rule(metrics, rule, picks)
        if layer is not None:
            break
    else:  # pragma: no cover - the middle and last rules need no metric
        raise AssertionError("no rule applies")
    stats = rules[rule]
    others = [r for r in summary["ranked"] if r != rule and r in (MIDDLE, LAST, *metrics.values)][:2]
    compared = ", ".join(f"{rule_in_words(r)} ({rules[r]['mean_regret_points']:.1f})" for r in others)
    reason = (
        f"{rule_in_words(rule)}. On layerwise's benchmark ({summary['cases']} model x task cases with "
        f"labels, benchmarks/label_free_layers.py) this rule's pick scored on average "
        f"{stats['mean_regret_points']:.1f} points below the best layer (within one point in "
        f"{stats['within_one_point']} cases); the next rules: {compared}."
    )
    return Recommendation(layer, rule, reason)
