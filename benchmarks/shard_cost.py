"""What cutting a corpus into shards costs: one store vs the same texts as many small stores.

    python benchmarks/shard_cost.py [--sentences 3000] [--documents 30]

Behind the 1,024-text minimum of lw.ray's automatic shard size: every hidden state of every token
of the default model into float16 stores, in one process, (a) one store, (b) shards of 256 texts,
(c) shards of 1,024 texts, written one after another. Prints seconds and the ratio to (a);
results: benchmarks/results/shard_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import mixed_corpus  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=3000)
    parser.add_argument("--documents", type=int, default=30)
    args = parser.parse_args()

    import layerwise as lw

    texts = mixed_corpus(args.sentences, args.documents, seed=2)
    encoder = lw.Encoder(device="cpu")
    encoder.extract(texts[:20])  # warm up
    scratch = Path(tempfile.mkdtemp(prefix="layerwise-shards-"))
    report: dict = {"n_texts": len(texts)}
    try:
        started = time.perf_counter()
        lw.extract_to_store(encoder, texts, scratch / "one.lw", progress=False)
        one = time.perf_counter() - started
        report["one_store_s"] = round(one, 1)
        print(f"one store: {one:.1f} s")
        for size in (256, 1024):
            started = time.perf_counter()
            for k, start in enumerate(range(0, len(texts), size)):
                lw.extract_to_store(
                    encoder, texts[start : start + size], scratch / f"{size}-{k}.lw", progress=False
                )
            seconds = time.perf_counter() - started
            report[f"shards_of_{size}"] = {"seconds": round(seconds, 1), "ratio": round(seconds / one, 2)}
            print(f"shards of {size}: {seconds:.1f} s, {seconds / one:.2f}x of one store")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "shard_cost.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
