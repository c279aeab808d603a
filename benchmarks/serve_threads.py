"""Where a loaded server's CPU goes, thread by thread: cores per thread of the HTTP process and of
the model process over a load, from /proc.

    python benchmarks/serve_threads.py [--clients 32] [--seconds 8] [--serve-args "..."]

Starts `layerwise serve` on 127.0.0.1 (as benchmarks/serve_load.py does, with its texts and load
client), warms it up at 32 clients for 2 s, then for each client count prints tokens/s and the cores
each thread used (threads under 0.005 of a core left out): the model process's stream threads, the
HTTP process's event loop and its batcher threads. The load client's own cores are printed too (it
shares the machine). Nothing is written: the figures are for reading next to serve_load's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from serve_load import corpus_and_encoder, load, process_tree, start_serve  # noqa: E402


def thread_cpu(pid: int) -> dict[tuple[str, int, str], float]:
    """CPU seconds of every thread of the server and its model process: (process, tid, name) -> s."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for index, process in enumerate(process_tree(pid)):
        role = "http" if index == 0 else "model"
        for task in Path(f"/proc/{process}/task").iterdir():
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                name = (task / "comm").read_text().strip()
            except OSError:  # the thread ended
                continue
            out[(role, int(task.name), name)] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="32")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--serve-args", default="", help="Extra `layerwise serve` options")
    args = parser.parse_args()

    texts, _, tokens = corpus_and_encoder(args.texts)
    process, url = start_serve(args.serve_args.split())
    try:
        asyncio.run(load(url, texts, tokens, 32, 2.0))  # warm up
        for clients in (int(c) for c in args.clients.split(",")):
            before, client_before, started = thread_cpu(process.pid), time.process_time(), time.perf_counter()
            row = asyncio.run(load(url, texts, tokens, clients, args.seconds))
            elapsed, after = time.perf_counter() - started, thread_cpu(process.pid)
            client = (time.process_time() - client_before) / elapsed
            print(f"{clients} clients: {row['tokens_per_s']:,} tokens/s, load client {client:.3f} cores")
            used = {key: (after[key] - before.get(key, 0.0)) / elapsed for key in after}
            for (role, tid, name), cores in sorted(used.items(), key=lambda item: -item[1]):
                if cores >= 0.005:
                    print(f"  {role:5s} {name:18s} {tid:>8d} {cores:.3f} cores", flush=True)
    finally:
        process.terminate()
        process.wait(60)


if __name__ == "__main__":
    main()
