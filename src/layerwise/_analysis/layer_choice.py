"""One answer to "which layer should I try first?", with the candidates behind it and how sure it is.

A *rule* turns the label-free metrics of the user's texts into a hidden state: a metric's pick
(label_free.HIGHER_IS_BETTER says which end it likes), or a fixed depth (the first layer, a quarter,
the middle, three quarters, the last). benchmarks/label_free_layers.py scores every rule on real
models and labelled tasks and writes data/label_free_rules.json: per *group* (encoder or decoder,
and the pooling the user will use: mean, last token, or token vectors) every rule's mean and worst
regret (points below the best layer) and the rules ranked by mean regret. Which rule a group
recommends was judged by leave-one-model-out: ranked on the other models, scored on the left-out
one; those held-out figures are in the table too, and quoted with every recommendation.

The candidates are the layers the best-ranked rules pick; when they lie further apart than the
benchmark's spread (how wide, in depth, the band of layers within two points of the best is), the
answer says the rules disagree and shows each candidate with its rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Literal, get_args

from ..errors import OptionError
from .label_free import HIGHER_IS_BETTER, METRICS, ONE_PASS_METRICS, LayerMetrics

Use = Literal["mean", "last", "token"]
USES: tuple[str, ...] = get_args(Use)
FIRST, QUARTER, MIDDLE, THREE_QUARTERS, LAST = (
    "first (1)",
    "quarter (L/4)",
    "middle (L/2)",
    "three quarters (3L/4)",
    "last (L)",
)
FIXED_RULES: dict[str, float] = {FIRST: 0.0, QUARTER: 0.25, MIDDLE: 0.5, THREE_QUARTERS: 0.75, LAST: 1.0}
RULES: tuple[str, ...] = (*FIXED_RULES, *METRICS)
DEFAULT_RULES: tuple[str, ...] = (
    *FIXED_RULES,
    *ONE_PASS_METRICS,
)  # what `layerwise layers` computes by default
MAX_CANDIDATES = 3


@cache
def benchmark_rules() -> dict:
    """The shipped rule table (see the module's docstring): ``version``, ``groups`` (``"decoder/mean"``
    -> ranked rules, per-rule regrets, spread, the group's held-out figures), ``held_out`` per kind,
    ``cases``."""
    text = resources.files("layerwise._analysis").joinpath("data/label_free_rules.json").read_text("utf-8")
    return json.loads(text)


def rule_in_words(rule: str) -> str:
    if rule == FIRST:
        return "the first layer (hidden state 1)"
    if rule == LAST:
        return "the last layer"
    if rule in FIXED_RULES:
        return f"the {rule.split(' (')[0]} layer (hidden state {rule.split('(')[1].rstrip(')')})"
    return f"the layer with the {'highest' if HIGHER_IS_BETTER[rule] else 'lowest'} {rule.replace('_', ' ')}"


def fixed_layer(rule: str, last: int) -> int:
    """The hidden state a fixed-depth rule picks in a model whose last hidden state is ``last``:
    round(fraction x last), at least 1 (the embeddings, state 0, are not contextual)."""
    return max(1, min(last, round(FIXED_RULES[rule] * last)))


def layer_by_rule(metrics: LayerMetrics, rule: str, picks: dict[str, int | None] | None = None) -> int | None:
    """The hidden state ``rule`` picks, or None when the rule's metric was not computed or has no
    signal. ``picks``: ``metrics.picks()`` when the caller has it already."""
    if rule in FIXED_RULES:
        return fixed_layer(rule, metrics.layers[-1])
    return (metrics.picks() if picks is None else picks).get(rule)


def use_of_pool(pool: str) -> str:
    """The benchmark group of an extract-style ``--pool``: sentence:mean -> mean, sentence:last ->
    last, token and word:* -> token."""
    pool = pool.strip().lower()
    if pool in ("sentence:mean", "mean"):
        return "mean"
    if pool in ("sentence:last", "last"):
        return "last"
    if pool == "token" or pool.startswith("word:"):
        return "token"
    raise OptionError(
        f"--pool {pool!r}: the recommendation's rules were measured for sentence:mean, sentence:last "
        "(decoders) and token vectors (word:* too); pass one of those"
    )


def group_name(kind: str, use: str) -> str:
    return f"{kind}/{use}"


@dataclass(frozen=True)
class Candidate:
    """A layer and the rules that pick it, best first, each with its mean and worst regret (points)."""

    layer: int
    rules: tuple[tuple[str, float, float], ...]

    def as_dict(self) -> dict:
        rules = [{"rule": r, "mean_regret": m, "worst_regret": w} for r, m, w in self.rules]
        return {"layer": self.layer, "rules": rules}


@dataclass(frozen=True)
class Recommendation:
    layer: int
    rule: str
    reason: str
    group: str = ""
    candidates: tuple[Candidate, ...] = ()
    agree: bool = True
    held_out: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"Try hidden state {self.layer} first: {self.reason}"

    def candidates_text(self) -> str:
        """One line per candidate layer, with its rules and their regret on the benchmark."""
        lines = []
        for candidate in self.candidates:
            shown = [
                f"{rule_in_words(r)} ({m:.1f} points on average, worst {w:.1f})"
                for r, m, w in candidate.rules
            ]
            more = len(shown) - 2
            rules = ", ".join(shown[:2]) + (f" and {more} more rule{'s' * (more > 1)}" if more > 0 else "")
            lines.append(f"  hidden state {candidate.layer}: {rules}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        table = benchmark_rules()
        return {
            "layer": self.layer,
            "rule": self.rule,
            "reason": self.reason,
            "group": self.group,
            "rules_agree": self.agree,
            "candidates": [c.as_dict() for c in self.candidates],
            "held_out": self.held_out,
            "rule_table_version": table.get("version"),
            "rule_table_cases": table.get("cases"),
        }


def _group(table: dict, kind: str, use: str) -> tuple[str, dict]:
    name = group_name(kind, use)
    if name in table["groups"]:
        return name, table["groups"][name]
    fallback = group_name(kind, "mean")  # a pooling the benchmark did not measure for this kind
    return fallback, table["groups"][fallback]


def recommend(metrics: LayerMetrics, *, kind: str = "encoder", use: str = "mean") -> Recommendation:
    """The layer to try first for a model of ``kind`` ("encoder" or "decoder") whose vectors will be
    used as ``use`` ("mean" or "last" pooled sentences, or "token" vectors), by the rule that ranks
    first on the benchmark for that group among the rules ``metrics`` can apply; with the candidate
    layers of the next rules and whether they agree."""
    if kind not in ("encoder", "decoder"):
        raise OptionError(f"kind {kind!r}: choose encoder or decoder")
    if use not in USES:
        raise OptionError(f"use {use!r}: choose from {', '.join(USES)}")
    table = benchmark_rules()
    name, group = _group(table, kind, use)
    picks = metrics.picks()
    ranked = [
        (rule, layer)
        for rule in group["ranked"]
        if (layer := layer_by_rule(metrics, rule, picks)) is not None
    ]
    if not ranked:  # pragma: no cover - the fixed rules need no metric
        raise AssertionError("no rule applies")
    rule, layer = ranked[0]
    regrets = group["rules"]
    candidates: dict[int, list[tuple[str, float, float]]] = {}
    for r, pick in ranked:
        if pick in candidates or len(candidates) < MAX_CANDIDATES:
            candidates.setdefault(pick, []).append((r, regrets[r]["mean"], regrets[r]["worst"]))
    top = list(candidates)[:2]
    last = metrics.layers[-1]
    spread = float(group["spread"])
    agree = len(top) < 2 or abs(top[0] - top[1]) / max(last, 1) <= spread
    held = group["held_out"]
    where = f"{kind}s, {'token vectors' if use == 'token' else use + '-pooled sentences'}"
    if name != group_name(kind, use):
        where += f" (the benchmark has no {use} cases for {kind}s: their mean-pooled cases)"
    reason = (
        f"{rule_in_words(rule)}. On layerwise's benchmark ({group['cases']} cases of {where}; "
        f"benchmarks/label_free_layers.py) its pick scored {regrets[rule]['mean']:.1f} points below the "
        f"best layer on average (worst {regrets[rule]['worst']:.1f}). Held out: this group's rule, chosen "
        f"without the model it was scored on, was {held['mean']:.1f} points below the best on average "
        f"(worst {held['worst']:.1f}, {held['cases']} cases; all {kind} cases: "
        f"{table['held_out'][kind]['mean']:.1f}, worst {table['held_out'][kind]['worst']:.1f})."
    )
    if not agree:
        gap = abs(top[0] - top[1])
        away = f"{gap} layer{'s' * (gap != 1)} away"
        band = f"{spread:.0%} of the depth" if spread >= 0.005 else "one layer: its best rules agreed exactly"
        reason += (
            f" The next rule picks hidden state {top[1]}, {away}: more than the benchmark's "
            f"spread ({band}), so try both (layerwise probe scores them with labels)."
        )
    frozen = tuple(Candidate(k, tuple(v)) for k, v in candidates.items())
    return Recommendation(layer, rule, reason, name, frozen, agree, dict(held))
