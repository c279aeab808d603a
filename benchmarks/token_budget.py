"""How the batch token budget (``max_tokens``) was chosen for CPU: packed extraction at several
budgets on one corpus, median of ``--repeats`` interleaved runs.

    python benchmarks/token_budget.py [--sentences 1000] [--documents 40] [--repeats 3] [--budgets 512,1024,2048,4096,8192]

Prints tokens/s per budget for the default model (all-MiniLM-L6-v2) and, with --base, for a
12-layer ``BertConfig()`` model. Results go to benchmarks/results/token_budget.json.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bert_base_folder, mixed_corpus, write_result

import layerwise as lw


def sweep(folder: str, texts: list[str], budgets: list[int], repeats: int) -> dict[int, float]:
    enc = lw.Encoder(folder, device="cpu", max_length=512)
    n_tokens = sum(len(e) for e in enc.tokenize(texts))
    enc.extract(texts[:16], progress=False)
    times: dict[int, list[float]] = {b: [] for b in budgets}
    for _ in range(repeats):
        for budget in budgets:
            start = time.perf_counter()
            enc.extract(texts, layers="all", max_tokens=budget, progress=False)
            times[budget].append(time.perf_counter() - start)
    rates = {b: n_tokens / statistics.median(t) for b, t in times.items()}
    for b, r in rates.items():
        print(f"  max_tokens={b:6d}: {r:8,.0f} tok/s  (runs {[round(t, 2) for t in times[b]]})")
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--documents", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budgets", default="512,1024,2048,4096,8192")
    parser.add_argument("--base", action="store_true", help="also a 12-layer BertConfig() model (300 texts)")
    args = parser.parse_args()
    logging.getLogger("layerwise").setLevel(logging.ERROR)
    budgets = [int(b) for b in args.budgets.split(",")]
    texts = mixed_corpus(args.sentences, args.documents)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; all-MiniLM-L6-v2, {len(texts)} texts"
    )
    results = {"default": sweep(str(lw.default_model_path()), texts, budgets, args.repeats)}
    if args.base:
        with bert_base_folder() as folder:
            print("BertConfig() 12 layers, 300 texts")
            subset = texts[:: max(1, len(texts) // 300)][:300]
            results["bert_base"] = sweep(str(folder), subset, budgets, args.repeats)
    write_result("token_budget", {k: {str(b): round(r) for b, r in v.items()} for k, v in results.items()})


if __name__ == "__main__":
    main()
