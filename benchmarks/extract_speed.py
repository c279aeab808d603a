"""Extraction speed: layerwise ``extract`` vs the one-text-at-a-time tutorial loop, and early stopping.

    python benchmarks/extract_speed.py [--sentences 1000] [--documents 40] [--repeats 2]

1. On a mixed-length UD EWT corpus (single sentences + whole documents), with the default model
   (all-MiniLM-L6-v2), tokens/s of
     (a) the tutorial loop: tokenizer(text) -> model(..., output_hidden_states=True) per text,
         under torch.no_grad, all hidden states stacked to NumPy;
     (b) ``Encoder.extract(texts, layers="all")`` with its default batching.
   Both produce every hidden state of every token; the ratio (b)/(a) is the speed-up. The
   machine's fp32 matmul rate is measured in the same run, to say how close (b) is to the roof.
2. On a randomly initialised 12-layer ``BertConfig()`` model (BERT-base shapes), the time of
   ``layers=[2]`` against ``layers="all"``: early stopping should cost <= 30 %.

Each measurement is the best of ``--repeats`` runs after a warm-up. Results go to
benchmarks/results/extract_speed.json.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    bert_base_folder,
    best_of,
    matmul_gflops,
    mixed_corpus,
    model_gflop,
    tutorial_loop,
    write_result,
)

import layerwise as lw


def early_stopping(texts: list[str], repeats: int) -> tuple[float, float, int]:
    with bert_base_folder() as folder:
        base = lw.Encoder(folder, device="cpu")
        base.extract(texts[:8])  # warm-up
        t_all = best_of(repeats, lambda: base.extract(texts, layers="all", progress=False))
        t_two = best_of(repeats, lambda: base.extract(texts, layers=[2], progress=False))
    return t_all, t_two, base.n_layers


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--documents", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    logging.getLogger("layerwise").setLevel(logging.ERROR)  # truncation is reported below

    texts = mixed_corpus(args.sentences, args.documents)
    enc = lw.Encoder(device="cpu", max_length=512)  # the loops truncate at 512 too
    encoded = enc.tokenize(texts)
    lengths = [len(e) for e in encoded]
    n_tokens = sum(lengths)
    print(
        f"corpus: {args.sentences} sentences + {args.documents} documents from UD EWT train = {len(texts)} "
        f"texts, {n_tokens} tokens ({sum(e.truncated for e in encoded)} documents truncated at 512)\n"
        f"torch threads: {torch.get_num_threads()}; extract batches: <= {enc.batch_size} texts and "
        f"<= {enc.max_tokens} padded tokens"
    )
    peak = matmul_gflops()
    print(f"fp32 matmul (2048x2048, torch): {peak:.0f} GFLOP/s")

    # --- 1. tutorial loop vs extract, default model -------------------------------------------
    tutorial_loop(enc.tokenizer, enc.model, texts[:20])  # warm-up
    enc.extract(texts[:20])
    counted: dict[str, int] = {}

    def run_loop() -> None:
        counted["loop"] = tutorial_loop(enc.tokenizer, enc.model, texts)

    def run_extract() -> None:
        counted["extract"] = sum(s.n_tokens for s in enc.extract(texts, layers="all", progress=False))

    t_loop = best_of(args.repeats, run_loop)
    t_extract = best_of(args.repeats, run_extract)
    assert counted["loop"] == counted["extract"] == n_tokens, counted
    speedup = t_loop / t_extract
    work = model_gflop(enc.model.config, lengths)
    print(f"tutorial loop (one text at a time): {t_loop:7.2f} s {n_tokens / t_loop:8.0f} tokens/s")
    print(
        f"layerwise extract:                  {t_extract:7.2f} s {n_tokens / t_extract:8.0f} tokens/s "
        f"({work / t_extract:.0f} GFLOP/s = {work / t_extract / peak:.0%} of the matmul rate)"
    )
    print(f"speed-up: {speedup:.2f}x (target >= 1.9x)")

    # --- 2. early stopping on a 12-layer BERT-base-shaped model --------------------------------
    subset = texts[: max(1, len(texts) // 4)]
    t_all, t_two, depth = early_stopping(subset, args.repeats)
    fraction = t_two / t_all
    print(
        f"BertConfig() {depth} layers, {len(subset)} texts: layers='all' {t_all:.2f} s, layers=[2] "
        f"{t_two:.2f} s -> {fraction:.0%} of 'all' (target <= 30%)"
    )

    result = {
        "fp32_matmul_gflops": round(peak, 1),
        "corpus": {
            "sentences": args.sentences,
            "documents": args.documents,
            "texts": len(texts),
            "tokens": n_tokens,
        },
        "tutorial_loop_s": round(t_loop, 3),
        "tutorial_loop_tokens_per_s": round(n_tokens / t_loop),
        "extract_s": round(t_extract, 3),
        "extract_tokens_per_s": round(n_tokens / t_extract),
        "extract_gflops": round(work / t_extract, 1),
        "speedup": round(speedup, 2),
        "extract_batch_size": enc.batch_size,
        "extract_max_tokens": enc.max_tokens,
        "bert_base_texts": len(subset),
        "bert_base_all_s": round(t_all, 3),
        "bert_base_layer2_s": round(t_two, 3),
        "layer2_fraction_of_all": round(fraction, 3),
    }
    write_result("extract_speed", result)


if __name__ == "__main__":
    main()
