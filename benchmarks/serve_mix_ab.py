"""Served/offline at 32 clients with the load client's two draws of texts, interleaved, one server.

    python benchmarks/serve_mix_ab.py [--rounds 5] [--seconds 10]

serve_load.py's client drew each request's text with replacement, seeded by the client count, so
every 32-client load replayed the same first ~2,300 draws, in which whole documents held 12 % of
the tokens against 8 % in the corpus that offline ``Encoder().encode`` measures. It now draws the
texts in shuffled passes (each text once per pass: the corpus's mix). This script measures what
the change does to the ratio: each round measures offline, then loads the same `layerwise serve`
with both draws (the order alternates), and reports each draw's ratio and the medians. Results:
benchmarks/results/serve_mix_ab.json (``--out`` to write elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from serve_load import DRAWS, RESULTS, corpus_and_encoder, load, offline_tokens_per_s, start_serve  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=RESULTS / "serve_mix_ab.json")
    args = parser.parse_args()

    texts, encoder, tokens = corpus_and_encoder(args.texts)
    process, url = start_serve()
    rounds = []
    try:
        asyncio.run(load(url, texts, tokens, args.clients, 3.0))  # warm up
        for round_ in range(args.rounds):
            offline = offline_tokens_per_s(encoder, texts, tokens)
            row: dict = {"round": round_, "offline_tokens_per_s": round(offline)}
            for draw in DRAWS[::-1] if round_ % 2 == 0 else DRAWS:  # replacement first in even rounds
                measured = asyncio.run(load(url, texts, tokens, args.clients, args.seconds, draw))
                row[draw] = {
                    "tokens_per_s": measured["tokens_per_s"],
                    "requests": measured["requests"],
                    "errors": measured["errors"],
                    "ratio": round(measured["tokens_per_s"] / offline, 3),
                }
            rounds.append(row)
            print(json.dumps(row), flush=True)
    finally:
        process.terminate()
        process.wait(60)
    medians = {draw: statistics.median(r[draw]["ratio"] for r in rounds) for draw in DRAWS}
    passes_over_replacement = statistics.median(
        r["passes"]["tokens_per_s"] / r["replacement"]["tokens_per_s"] for r in rounds
    )
    print(
        f"served/offline at {args.clients} clients, medians of {len(rounds)} rounds: "
        + ", ".join(f"{draw} {m:.2f}x" for draw, m in medians.items())
        + f"; passes / replacement {passes_over_replacement:.3f}x"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "clients": args.clients,
        "seconds": args.seconds,
        "median_ratio": medians,
        "passes_over_replacement": round(passes_over_replacement, 3),
        "rounds": rounds,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
