"""Sentence vectors of every layer against every token of every layer, on the same texts:
`embed(layers="all")` pools on the model's device (features/device_pool.py), so it should cost no
more than `extract(layers="all")`, whose every token crosses to the host.

    python benchmarks/embed_vs_extract.py [--texts 1500] [--rounds 3] [--device cpu]

UD EWT dev sentences, the default model; interleaved rounds after one warm-up call; the ratio
embed / extract per round and its median.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import parser, read_documents, write_result


def main() -> None:
    import layerwise as lw

    args_parser = parser(__doc__)
    args_parser.add_argument("--texts", type=int, default=1500)
    args_parser.add_argument("--rounds", type=int, default=3)
    args_parser.add_argument("--device", default="cpu")
    args = args_parser.parse_args()
    texts = [s for doc in read_documents("dev") for s in doc][: args.texts]
    encoder = lw.Encoder(device=args.device)
    n_tokens = sum(len(item) for item in encoder.tokenize(texts))
    encoder.embed(texts[:64], layers="all", progress=False)
    encoder.extract(texts[:64], layers="all", progress=False)
    rounds = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        stacks = encoder.extract(texts, layers="all", progress=False)
        extract_s = time.perf_counter() - started
        del stacks
        started = time.perf_counter()
        encoder.embed(texts, layers="all", pool="mean", progress=False)
        embed_s = time.perf_counter() - started
        rounds.append({"extract_s": extract_s, "embed_s": embed_s, "ratio": embed_s / extract_s})
        print(
            f"extract {extract_s:.2f} s, embed {embed_s:.2f} s: embed/extract {embed_s / extract_s:.2f}",
            flush=True,
        )
    median = statistics.median(r["ratio"] for r in rounds)
    print(f"median embed/extract {median:.2f} ({len(texts)} texts, {n_tokens} tokens, {args.device})")
    write_result("embed_vs_extract", {"texts": len(texts), "tokens": n_tokens, "device": args.device,
                                      "rounds": rounds, "median_ratio": median})  # fmt: skip


if __name__ == "__main__":
    main()
