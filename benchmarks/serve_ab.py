"""Interleaved A/B of `layerwise serve` settings: served tokens/s over offline, round after round.

    python benchmarks/serve_ab.py "--in-process --streams 1 --max-wait-ms 10" "" --rounds 3 --clients 8,32

Each argument is one setting (extra `layerwise serve` options; "" is the default). Every round
measures offline ``Encoder().encode`` over the texts, then starts each setting's server in turn
(2 s of warm-up at 32 clients, then ``--seconds`` per client count) and divides its tokens/s by
that round's offline figure. This machine's speed drifts by about 10 % from minute to minute, so a
setting is only compared with another inside a round, and the medians over rounds are reported.
Same texts and load client as benchmarks/serve_load.py. Results: benchmarks/results/serve_ab.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from serve_load import RESULTS, corpus_and_encoder, cpu_seconds, free_port, load, start  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("settings", nargs="+", help='`layerwise serve` options per setting ("" = default)')
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="8,32")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--texts", type=int, default=2000)
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]

    texts, encoder, tokens = corpus_and_encoder(args.texts)
    runs: dict[str, list[dict]] = {setting: [] for setting in args.settings}
    for round_ in range(args.rounds):
        started = time.perf_counter()
        encoder.encode(texts)
        offline = sum(tokens.values()) / (time.perf_counter() - started)
        for setting in args.settings:
            port = free_port()
            command = [sys.executable, "-m", "layerwise.cli", "serve", "--port", str(port), "--device", "cpu"]
            process = start([*command, *setting.split()], port)
            try:
                url = f"http://127.0.0.1:{port}"
                asyncio.run(load(url, texts, tokens, 32, 2.0))  # warm up
                row: dict = {"round": round_, "offline_tokens_per_s": round(offline)}
                for clients in levels:
                    cpu = cpu_seconds(process.pid)
                    measured = asyncio.run(load(url, texts, tokens, clients, args.seconds))
                    row[str(clients)] = {
                        "tokens_per_s": measured["tokens_per_s"],
                        "ratio": round(measured["tokens_per_s"] / offline, 3),
                        "p50_ms": measured["p50_ms"],
                        "p99_ms": measured["p99_ms"],
                        "errors": measured["errors"],
                        "server_cores": round((cpu_seconds(process.pid) - cpu) / measured["seconds"], 2),
                    }
            finally:
                process.terminate()
                process.wait(60)
            runs[setting].append(row)
            print(f"round {round_} [{setting or 'default'}] {json.dumps(row)}", flush=True)
    summary = {
        setting or "default": {
            str(clients): statistics.median(row[str(clients)]["ratio"] for row in rows) for clients in levels
        }
        for setting, rows in runs.items()
    }
    for setting, medians in summary.items():
        shown = ", ".join(f"{c} clients {r:.2f}x" for c, r in medians.items())
        print(f"[{setting}] median served/offline: {shown}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "serve_ab.json").write_text(
        json.dumps({"median_ratio": summary, "runs": runs}, indent=2) + "\n", encoding="utf-8"
    )


if __name__ == "__main__":
    main()
