"""Load test of `layerwise serve` against offline embedding and a plain sentence-transformers server.

    python benchmarks/serve_load.py [--clients 1,8,32,64] [--seconds 10] [--texts 2000]

Everything on 127.0.0.1. Texts: UD EWT train sentences plus a few whole documents (mixed lengths),
one text per request as an application embeds a query or a document, in shuffled passes over the
texts (the same mix as offline). For each concurrency level,
that many clients send requests back to back for ``--seconds`` (then finish their last request);
the script prints requests/s, tokens/s, p50/p99 latency, errors, and the server's RSS before and
after the level and its peak (VmHWM); then a soak (``--soak`` seconds at 32 clients, in
``--soak-parts`` parts, four by default) shows whether RSS stays flat once the server has seen every
batch shape. For layerwise each level also gives, from the server's /metrics, the model runs it
made, their mean requests, wall time and queue wait (how the clients' closed loop sizes the runs).
Offline throughput is ``Encoder().encode`` over the same texts in this process. The ratio served/offline at
32 clients (does dynamic batching work?) comes from ``--ratio-rounds`` loads of 32 clients after
the levels, each between two offline passes and set against their mean: this machine's speed drifts
by 10 % from one minute to the next, so a ratio of two measurements a minute apart says little, and
one taken before and after cancels a steady drift; the median of the rounds is reported, each round
too. The baseline is sentence-transformers behind the simplest FastAPI
endpoint a user would write (benchmarks/st_server.py: one request = one ``encode`` call),
loaded the same way and measured the same way. Results: benchmarks/results/serve_load.json (``--out``
to write elsewhere, e.g. another machine's results).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    HERE,
    free_port,
    mixed_corpus,
    process_tree,
    rss_kib,
    rss_tree_kib,
    serve_command,
    start,
    write_result,
)
from common import parser as make_parser


def stat_cpu_seconds(stat: Path) -> float:
    """User + system CPU seconds from a /proc ``stat`` file (a process's or one of its threads')."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_split(pid: int) -> tuple[float, float]:
    """CPU seconds of the server's own process (HTTP), and of its children (the model process)."""
    times = [stat_cpu_seconds(Path(f"/proc/{p}/stat")) for p in process_tree(pid)]
    return times[0], sum(times[1:])


def cpu_columns(before: tuple[float, float], after: tuple[float, float], row: dict) -> dict:
    """Cores used by the HTTP process and the model process over a load, and the HTTP process's
    CPU milliseconds per request."""
    http, model = after[0] - before[0], after[1] - before[1]
    return {
        "server_cores": round((http + model) / row["seconds"], 2),
        "http_cores": round(http / row["seconds"], 2),
        "model_cores": round(model / row["seconds"], 2),
        "http_ms_per_request": round(1000 * http / max(row["requests"], 1), 3),
    }


METRIC_SUMS = {  # (sample, its endpoint label or "") -> name: the /metrics sums the run accounts need
    ("layerwise_queue_wait_seconds_sum", ""): "wait_sum",
    ("layerwise_queue_wait_seconds_count", ""): "waits",
    ("layerwise_request_seconds_sum", "/v1/embeddings"): "latency_sum",
    ("layerwise_batch_requests_sum", ""): "run_requests",
    ("layerwise_batch_requests_count", ""): "runs",
    ("layerwise_run_seconds_sum", ""): "run_seconds",
}


def metric_sums(url: str) -> dict[str, float] | None:
    """The sums and counts of the server's queue, request and run histograms from its /metrics,
    summed over the other labels (models); None for a server without /metrics (the
    sentence-transformers baseline)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(f"{url}/metrics", timeout=10)
    if response.status_code != 200:
        return None
    out = dict.fromkeys(METRIC_SUMS.values(), 0.0)
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            key = (sample.name, sample.labels.get("endpoint", ""))
            if key in METRIC_SUMS:
                out[METRIC_SUMS[key]] += sample.value
    return out


def run_columns(before: dict[str, float] | None, after: dict[str, float] | None) -> dict:
    """Over a load, from two :func:`metric_sums`: the model runs made, their mean requests, their
    mean wall time (sent to the model process until the results are back) and the mean time a
    request waited in the queue for a stream. They show how the closed loop of the clients sizes
    the runs."""
    if before is None or after is None:
        return {}
    d = {key: after[key] - before[key] for key in after}
    runs = max(d["runs"], 1.0)
    return {
        "runs": round(d["runs"]),
        "requests_per_run": round(d["run_requests"] / runs, 2),
        "run_ms": round(1000 * d["run_seconds"] / runs, 1),
        "queue_wait_ms": round(1000 * d["wait_sum"] / max(d["waits"], 1.0), 1),
    }


async def load(url: str, texts: list[str], tokens: dict[str, int], clients: int, seconds: float) -> dict:
    """``clients`` keep-alive connections, each sending one request after another, the texts drawn
    in shuffled passes (each text once per pass: the corpus's mix, as offline).

    The client is plain asyncio on sockets with the request bytes built before the clock starts
    (httpx costs about 1.5 ms of CPU per request: 0.3 of the 2 cores at 32 clients, taken from the
    server it measures). Every response is still checked: status 200 and one embedding in the JSON.
    """
    import orjson  # a tenth of the stdlib json's CPU on a float embedding's body (10 vs 118 us)

    host, port = url.removeprefix("http://").split(":")
    rng = random.Random(clients)
    deck: list[str] = []

    def next_text() -> str:
        if not deck:
            deck.extend(texts)
            rng.shuffle(deck)
        return deck.pop()

    requests = {}
    for text in texts:
        body = json.dumps({"input": [text], "encoding_format": "float"}).encode()
        head = (
            f"POST /v1/embeddings HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        requests[text] = head.encode() + body
    latencies: list[float] = []
    errors = 0
    n_tokens = 0
    stop_at = time.perf_counter() + seconds

    async def one_client() -> None:
        nonlocal errors, n_tokens
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while time.perf_counter() < stop_at:
                text = next_text()
                started = time.perf_counter()
                writer.write(requests[text])
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length)
                latencies.append(time.perf_counter() - started)
                if not head.startswith(b"HTTP/1.1 200") or len(orjson.loads(body)["data"]) != 1:
                    errors += 1
                else:
                    n_tokens += tokens[text]
        finally:
            writer.close()

    began = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": errors,
        "seconds": round(elapsed, 2),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "tokens_per_s": round(n_tokens / elapsed),
        "p50_ms": round(1000 * statistics.median(latencies), 1),
        "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1),
    }


def corpus_and_encoder(n_texts: int):
    """The mixed-length texts, a warmed-up default Encoder, and each text's token count as the
    servers count them (truncated at the model's max_seq_length, specials included)."""
    import layerwise as lw

    texts = mixed_corpus(n_texts, max(1, n_texts // 100), seed=1)
    encoder = lw.Encoder(device="cpu")
    tokens = {t: len(s) for t, s in zip(texts, encoder.tokenize(texts), strict=True)}
    encoder.encode(texts[:64])  # warm up
    return texts, encoder, tokens


def offline_tokens_per_s(encoder, texts: list[str], tokens: dict[str, int]) -> float:
    """Offline ``Encoder().encode`` over the texts, in tokens per second."""
    started = time.perf_counter()
    encoder.encode(texts)
    return sum(tokens.values()) / (time.perf_counter() - started)


def measure_server(
    name: str,
    command: list[str],
    port: int,
    texts,
    tokens,
    levels,
    seconds,
    soak_seconds,
    soak_parts: int = 4,
    ratio=None,
) -> dict:
    process = start(command, port)
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        for clients in levels:
            before = rss_tree_kib(process.pid)
            runs_before = metric_sums(url)
            server_cpu, client_cpu = cpu_split(process.pid), time.process_time()
            row = asyncio.run(load(url, texts, tokens, clients, seconds))
            row.update(
                rss_before_mib=round(before / 1024),
                rss_after_mib=round(rss_tree_kib(process.pid) / 1024),
                **cpu_columns(server_cpu, cpu_split(process.pid), row),
                client_cores=round((time.process_time() - client_cpu) / row["seconds"], 2),
                **run_columns(runs_before, metric_sums(url)),
            )
            rows.append(row)
            print(f"{name:12s} {json.dumps(row)}", flush=True)
        # soak: does memory stay flat once every batch shape has been seen? RSS after each part
        # (and each process's: the HTTP process and the model process grow for different reasons)
        soak: list[int] = []
        soak_by_process: list[list[int]] = []

        def read_soak_rss() -> None:  # one reading of each process, and their total
            kib = [rss_kib(p) for p in process_tree(process.pid)]
            soak.append(round(sum(kib) / 1024))
            soak_by_process.append([round(k / 1024) for k in kib])

        read_soak_rss()
        soak_requests = soak_errors = 0
        for _ in range(soak_parts if soak_seconds > 0 else 0):
            part = asyncio.run(load(f"http://127.0.0.1:{port}", texts, tokens, 32, soak_seconds / soak_parts))
            soak_requests, soak_errors = soak_requests + part["requests"], soak_errors + part["errors"]
            read_soak_rss()
        if len(soak) > 1:
            print(f"{name:12s} soak at 32 clients, RSS MiB after each part: {soak}", flush=True)
            print(f"{name:12s} the same by process (server first): {soak_by_process}", flush=True)
            print(f"{name:12s} soak: {soak_requests} requests, {soak_errors} errors", flush=True)
        rounds = []
        # offline, 32 clients, offline, 32 clients, ..., offline: each load between two offline
        # passes, its ratio against their mean, so that a drift of the machine's speed during the
        # round (often 10 % a minute here) cancels to first order instead of landing on the ratio
        before = ratio[1]() if ratio and ratio[0] > 0 else 0.0
        for _ in range(ratio[0] if ratio else 0):
            row = asyncio.run(load(f"http://127.0.0.1:{port}", texts, tokens, 32, seconds))
            after = ratio[1]()
            offline = (before + after) / 2
            rounds.append(
                {"offline_before": round(before), "offline_after": round(after),
                 "offline_tokens_per_s": round(offline), "served_tokens_per_s": row["tokens_per_s"],
                 "ratio": round(row["tokens_per_s"] / offline, 2)}
            )  # fmt: skip
            print(f"{name:12s} ratio round at 32 clients: {json.dumps(rounds[-1])}", flush=True)
            before = after
        peak = rss_tree_kib(process.pid, "VmHWM")
    finally:
        process.terminate()
        process.wait(60)
    return {
        "levels": rows,
        "soak_seconds": soak_seconds,
        "soak_rss_mib": soak,
        "soak_rss_mib_by_process": soak_by_process,
        "soak_requests": soak_requests,
        "soak_errors": soak_errors,
        "peak_rss_mib": round(peak / 1024),
        "ratio_rounds": rounds,
    }


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument("--clients", default="1,8,32,64")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument(
        "--soak",
        type=float,
        default=40.0,
        help="Seconds at 32 clients after the levels (RSS after each part)",
    )
    parser.add_argument("--soak-parts", type=int, default=4, help="Parts of the soak, RSS read after each")
    parser.add_argument("--ratio-rounds", type=int, default=3, help="32-client loads, between offline passes")
    parser.add_argument(
        "--serve-args", default="", help="Extra `layerwise serve` options, e.g. '--max-wait-ms 2'"
    )
    parser.add_argument("--out", type=Path, default=None, help="Write the results here instead")
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]

    texts, encoder, tokens = corpus_and_encoder(args.texts)

    offline = offline_tokens_per_s(encoder, texts, tokens)
    print(f"offline Encoder().encode: {offline:,.0f} tokens/s ({len(texts)} texts)", flush=True)

    report: dict = {
        "offline_tokens_per_s": round(offline),
        "n_texts": len(texts),
        "seconds_per_level": args.seconds,
    }
    port = free_port()
    serve = serve_command(port, args.serve_args.split())
    report["layerwise"] = measure_server(
        "layerwise", serve, port, texts, tokens, levels, args.seconds, args.soak, args.soak_parts,
        ratio=(args.ratio_rounds, lambda: offline_tokens_per_s(encoder, texts, tokens)),
    )  # fmt: skip
    if not args.skip_baseline:
        port = free_port()
        baseline = [sys.executable, str(HERE / "st_server.py"), "--port", str(port)]
        report["sentence_transformers"] = measure_server(
            "st+fastapi",
            baseline,
            port,
            texts,
            tokens,
            levels,
            args.seconds,
            args.soak,
            args.soak_parts,
        )
    at = {row["clients"]: row for row in report["layerwise"]["levels"]}
    rounds = report["layerwise"]["ratio_rounds"]
    if rounds:
        report["served_over_offline_at_32"] = statistics.median(r["ratio"] for r in rounds)
        print(
            f"layerwise at 32 clients: {report['served_over_offline_at_32']:.2f}x offline throughput "
            f"(median of {len(rounds)} rounds: {', '.join(str(r['ratio']) for r in rounds)})"
        )
    if 32 in at and "sentence_transformers" in report:
        base = {row["clients"]: row for row in report["sentence_transformers"]["levels"]}
        report["layerwise_over_baseline_at_32"] = round(at[32]["tokens_per_s"] / base[32]["tokens_per_s"], 2)
        print(
            f"layerwise / sentence-transformers+FastAPI at 32 clients: {report['layerwise_over_baseline_at_32']:.2f}x"
        )
    write_result("serve_load", report, args.out)


if __name__ == "__main__":
    main()
