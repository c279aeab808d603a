"""Interleaved A/B of `layerwise serve` settings: served tokens/s over offline, round after round.

    python benchmarks/serve_ab.py "--in-process --streams 1 --max-wait-ms 10" "" --rounds 6 --clients 8,32
    python benchmarks/serve_ab.py "PYTHONPATH=/tmp/old/src" ""    # two checkouts: old code vs this one

Each argument is one setting (extra `layerwise serve` options; "" is the default); leading
``NAME=value`` words are set in that server's environment (``PYTHONPATH=<a checkout>/src`` serves
another version of layerwise). Every setting's server is started once, up front, and warmed up
(an idle server takes no CPU). Each round measures offline ``Encoder().encode`` over the texts,
then loads each server in turn (``--seconds`` per client count; the order rotates from round to
round), and divides its tokens/s by that round's offline figure. This machine's speed drifts by
about 10 % from minute to minute, so settings are compared only inside a round, seconds apart:
the medians over rounds of each setting's ratio to offline, and of its tokens/s over the first
setting's, are reported. Same texts and load client as benchmarks/serve_load.py. Results:
benchmarks/results/serve_ab.json.
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
from serve_load import (  # noqa: E402
    RESULTS,
    corpus_and_encoder,
    cpu_columns,
    cpu_split,
    load,
    offline_tokens_per_s,
    start_serve,
)


def launch(setting: str):
    """The server for one setting: (process, url)."""
    words = setting.split()
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
    options = [w for w in words if "=" not in w or w.startswith("-")]
    return start_serve(options, env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("settings", nargs="+", help='`layerwise serve` options per setting ("" = default)')
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--clients", default="8,32")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--texts", type=int, default=2000)
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    settings = args.settings

    texts, encoder, tokens = corpus_and_encoder(args.texts)
    servers = {}
    try:
        for setting in settings:
            servers[setting] = launch(setting)
            asyncio.run(load(servers[setting][1], texts, tokens, 32, 2.0))  # warm up
        runs: dict[str, list[dict]] = {setting: [] for setting in settings}
        for round_ in range(args.rounds):
            offline = offline_tokens_per_s(encoder, texts, tokens)
            order = settings[round_ % len(settings) :] + settings[: round_ % len(settings)]
            for setting in order:
                process, url = servers[setting]
                row: dict = {"round": round_, "offline_tokens_per_s": round(offline)}
                for clients in levels:
                    cpu = cpu_split(process.pid)
                    measured = asyncio.run(load(url, texts, tokens, clients, args.seconds))
                    row[str(clients)] = {
                        "tokens_per_s": measured["tokens_per_s"],
                        "ratio": round(measured["tokens_per_s"] / offline, 3),
                        "p50_ms": measured["p50_ms"],
                        "p99_ms": measured["p99_ms"],
                        "errors": measured["errors"],
                        **cpu_columns(cpu, cpu_split(process.pid), measured),
                    }
                runs[setting].append(row)
                print(f"round {round_} [{setting or 'default'}] {json.dumps(row)}", flush=True)
    finally:
        for process, _ in servers.values():
            process.terminate()
        for process, _ in servers.values():
            process.wait(60)

    first = runs[settings[0]]
    summary = {
        setting or "default": {
            str(clients): {
                "ratio_to_offline": statistics.median(row[str(clients)]["ratio"] for row in rows),
                f"vs_{settings[0] or 'default'}": statistics.median(
                    row[str(clients)]["tokens_per_s"] / base[str(clients)]["tokens_per_s"]
                    for row, base in zip(rows, first, strict=True)
                ),
            }
            for clients in levels
        }
        for setting, rows in runs.items()
    }
    for setting, medians in summary.items():
        shown = ", ".join(
            f"{c} clients {m['ratio_to_offline']:.2f}x offline, {list(m.values())[1]:.3f}x the first"
            for c, m in medians.items()
        )
        print(f"[{setting}] medians: {shown}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "serve_ab.json").write_text(
        json.dumps({"settings": settings, "median": summary, "runs": runs}, indent=2) + "\n", encoding="utf-8"
    )


if __name__ == "__main__":
    main()
