"""Where a loaded server's CPU goes, thread by thread, and where its clients' requests wait: cores
and run-queue waits per thread of the HTTP process and of the model process over a load, from /proc,
and the requests in the queue and in the handler, from /metrics.

    python benchmarks/serve_threads.py [--clients 32] [--seconds 8] [--serve-args "..."]

Starts `layerwise serve` on 127.0.0.1 (as benchmarks/serve_load.py does, with its texts and load
client), warms it up at 32 clients for 2 s, then for each client count prints tokens/s and:

- each thread's cores (threads under 0.005 of a core left out): the model process's stream threads,
  the HTTP process's event loop and its batcher threads; and, where the kernel keeps schedstat, the
  share of a core each spent runnable but waiting for one (another thread had it), and the rest of
  its time, asleep (for the model process's stream threads: waiting for their next run). The load
  client's own cores (it shares the machine), and the machine's idle share from /proc/stat;
- where the requests are, on average (Little's law over /metrics' sums: requests/s x mean seconds):
  in the queue (``layerwise_queue_wait_seconds``), inside the server from arrival to last byte
  (``layerwise_request_seconds``; the rest of it is their runs and delivery), and the rest of the
  clients (their sockets, the load client), with the runs' count, requests per run and seconds.

Nothing is written: the figures are for reading next to serve_load's.
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
from serve_load import (  # noqa: E402
    corpus_and_encoder,
    load,
    metric_sums,
    process_tree,
    run_columns,
    start_serve,
    stat_cpu_seconds,
)


def thread_cpu(pid: int) -> dict[tuple[str, int, str], tuple[float, float | None]]:
    """(CPU seconds, seconds runnable but waiting for a core: None where the kernel keeps no
    schedstat) of every thread of the server and its model process: (process, tid, name) -> both."""
    out = {}
    for index, process in enumerate(process_tree(pid)):
        role = "http" if index == 0 else "model"
        for task in Path(f"/proc/{process}/task").iterdir():
            try:
                key = (role, int(task.name), (task / "comm").read_text().strip())
                try:
                    on_cpu, waiting, _ = (int(x) for x in (task / "schedstat").read_text().split())
                    out[key] = (on_cpu / 1e9, waiting / 1e9)
                except (OSError, ValueError):  # no schedstat here: utime + stime, no waits
                    out[key] = (stat_cpu_seconds(task / "stat"), None)
            except OSError:  # the thread ended
                continue
    return out


def machine_idle() -> tuple[int, int]:
    """(idle ticks, all ticks) of the whole machine so far, from /proc/stat."""
    values = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return values[3] + values[4], sum(values)


def queue_account(
    before: dict[str, float] | None, after: dict[str, float] | None, clients: int, elapsed: float
) -> str:
    """Where the clients' requests were, on average over the load (Little's law)."""
    if before is None or after is None:
        return "  requests: the server answered no /metrics"
    in_queue = (after["wait_sum"] - before["wait_sum"]) / elapsed
    in_server = (after["latency_sum"] - before["latency_sum"]) / elapsed
    runs = run_columns(before, after)
    return (
        f"  requests: {in_queue:.1f} in the queue, {in_server - in_queue:.1f} in runs and delivery, "
        f"{clients - in_server:.1f} outside the server (of {clients}); "
        f"{runs['runs'] / elapsed:.1f} runs/s of {runs['requests_per_run']:.1f} requests, "
        f"{runs['run_ms']:.0f} ms each; mean queue wait {runs['queue_wait_ms']:.1f} ms"
    )


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
            sums_before, idle_before = metric_sums(url), machine_idle()
            before, client_before, started = thread_cpu(process.pid), time.process_time(), time.perf_counter()
            row = asyncio.run(load(url, texts, tokens, clients, args.seconds))
            elapsed, after = time.perf_counter() - started, thread_cpu(process.pid)
            client = (time.process_time() - client_before) / elapsed
            idle_after, sums_after = machine_idle(), metric_sums(url)
            idle = (
                (os.cpu_count() or 1)
                * (idle_after[0] - idle_before[0])
                / max(idle_after[1] - idle_before[1], 1)
            )
            print(
                f"{clients} clients: {row['tokens_per_s']:,} tokens/s, load client {client:.3f} cores, "
                f"machine idle {idle:.3f} cores"
            )
            print(queue_account(sums_before, sums_after, clients, elapsed))
            used = {}  # thread -> (cores, share of a core spent waiting for one, or None)
            for key, (cpu, waited) in after.items():
                cpu_before, waited_before = before.get(key, (0.0, 0.0))
                wait = None if waited is None else (waited - (waited_before or 0.0)) / elapsed
                used[key] = ((cpu - cpu_before) / elapsed, wait)
            for (role, tid, name), (cores, wait) in sorted(used.items(), key=lambda item: -item[1][0]):
                if cores >= 0.005:
                    # the rest of the thread's time it slept: for a stream thread, waiting for its next run
                    waiting = (
                        ""
                        if wait is None
                        else f", waiting for a core {wait:.3f}, asleep {max(0.0, 1 - cores - wait):.3f}"
                    )
                    print(f"  {role:5s} {name:18s} {tid:>8d} {cores:.3f} cores{waiting}", flush=True)
    finally:
        process.terminate()
        process.wait(60)


if __name__ == "__main__":
    main()
