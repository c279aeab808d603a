"""Corpus-scale extraction to disk, each contender as a whole process.

    python benchmarks/store_speed.py [--sentences 2000] [--documents 50] [--rss-small 10000] [--rss-large 100000]

On a mixed-length corpus from UD EWT (single sentences + whole documents), all hidden states of
every token of the default model, float16, written to disk:

  (a) the best hand-written loop   benchmarks/handwritten_loops.py best
  (b) the one-at-a-time tutorial   benchmarks/handwritten_loops.py tutorial
  (c) layerwise extract corpus.txt -o corpus.lw

Each is timed as a whole process (start-up and model loading included, the same for all three),
and tokens/s, the ratios and the share of the machine's fp32 matmul rate (measured here) are
printed. Then peak RSS of ``layerwise extract`` for a small and a large corpus shows that memory
stays flat as the corpus grows (``--layers 0`` keeps that run short: the pipeline, tokenisation,
batching and store writes are the same). Results go to benchmarks/results/store_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import mixed_corpus, read_documents  # noqa: E402
from extract_speed import matmul_gflops, model_gflop  # noqa: E402

RESULTS = HERE / "results"


def timed(command: list[str]) -> tuple[float, int]:
    """Wall time and peak RSS (KiB) of one command, measured by a wrapper whose only child it is."""
    wrapper = (
        "import resource, subprocess, sys, time\n"
        "t = time.perf_counter(); subprocess.run(sys.argv[1:], check=True)\n"
        "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", wrapper, *command], check=True, capture_output=True, text=True
    )
    seconds, rss = out.stdout.split()
    return float(seconds), int(rss)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--documents", type=int, default=50)
    parser.add_argument("--rss-small", type=int, default=10_000)
    parser.add_argument("--rss-large", type=int, default=100_000)
    args = parser.parse_args()

    import torch

    import layerwise as lw

    work = Path(tempfile.mkdtemp(prefix="lw-store-bench-"))
    try:
        texts = mixed_corpus(args.sentences, args.documents)
        corpus = work / "corpus.txt"
        corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
        enc = lw.Encoder(device="cpu", max_length=512)
        lengths = [len(e) for e in enc.tokenize(texts)]
        n_tokens, flops = sum(lengths), model_gflop(enc.model.config, lengths)
        peak = matmul_gflops()
        print(f"corpus: {len(texts)} texts ({args.sentences} sentences + {args.documents} documents), "
              f"{n_tokens} tokens; torch threads {torch.get_num_threads()}; fp32 matmul {peak:.0f} GFLOP/s")  # fmt: skip
        loops = HERE / "handwritten_loops.py"
        runs = {
            "best hand-written loop": [sys.executable, str(loops), "best", str(corpus), str(work / "a")],
            "one-at-a-time tutorial": [sys.executable, str(loops), "tutorial", str(corpus), str(work / "b")],
            "layerwise extract -> store": [
                "layerwise",
                "extract",
                str(corpus),
                "-o",
                str(work / "c.lw"),
                "--max-length",
                "512",  # the hand-written loops truncate at 512 too
                "-q",
            ],
        }
        times = {}
        for name, command in runs.items():
            seconds, rss = timed(command)
            times[name] = seconds
            print(f"{name:28s} {seconds:7.1f} s {n_tokens / seconds:7.0f} tokens/s  "
                  f"{flops / seconds / peak:5.1%} of matmul peak  peak RSS {rss / 1024:5.0f} MiB")  # fmt: skip
        store = lw.open_store(work / "c.lw")
        assert store.complete and store.n_rows == n_tokens, store
        ours = times["layerwise extract -> store"]
        vs_best = times["best hand-written loop"] / ours
        vs_tutorial = times["one-at-a-time tutorial"] / ours
        print(
            f"layerwise vs best loop: {vs_best:.2f}x (target >= 1.1x); vs tutorial: {vs_tutorial:.2f}x (target >= 2x)"
        )
        disk = sum(f.stat().st_size for f in (work / "c.lw").rglob("*") if f.is_file())
        print(
            f"store size: {disk / 2**20:.1f} MiB = {disk / n_tokens / 1024:.2f} KiB per token (7 x 384 float16)"
        )

        # memory stays flat: the same pipeline on a small and a large corpus
        sentences = [s for doc in read_documents("train") for s in doc]
        rss = {}
        for n in (args.rss_small, args.rss_large):
            path = work / f"rss-{n}.txt"
            path.write_text(
                "\n".join(sentences[i % len(sentences)] for i in range(n)) + "\n", encoding="utf-8"
            )
            seconds, peak_rss = timed(["layerwise", "extract", str(path), "-o", str(work / f"rss-{n}.lw"), "--layers", "0", "-q"])  # fmt: skip
            rss[n] = peak_rss
            print(f"peak RSS, {n:>7} texts (--layers 0): {peak_rss / 1024:6.0f} MiB in {seconds:.0f} s")
            shutil.rmtree(work / f"rss-{n}.lw")
        growth = rss[args.rss_large] / rss[args.rss_small] - 1
        print(f"RSS growth {args.rss_small} -> {args.rss_large} texts: {growth:+.1%} (target within 20%)")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "store_speed.json").write_text(json.dumps({
        "corpus": {"texts": len(texts), "sentences": args.sentences, "documents": args.documents, "tokens": n_tokens},
        "fp32_matmul_gflops": round(peak, 1),
        "seconds": {k: round(v, 2) for k, v in times.items()},
        "tokens_per_s": {k: round(n_tokens / v) for k, v in times.items()},
        "share_of_matmul_peak": {k: round(flops / v / peak, 3) for k, v in times.items()},
        "speedup_vs_best_loop": round(vs_best, 2),
        "speedup_vs_tutorial": round(vs_tutorial, 2),
        "store_bytes_per_token": round(disk / n_tokens),
        "peak_rss_mib": {str(k): round(v / 1024) for k, v in rss.items()},
        "rss_growth": round(growth, 3),
    }, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
