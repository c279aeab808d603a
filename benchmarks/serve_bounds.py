"""Peak memory of `layerwise serve` while 32 clients each send the largest request an endpoint admits.

    python benchmarks/serve_bounds.py [--clients 32] [--seconds 15]

For each endpoint in turn, starts `layerwise serve` afresh (the default model, its default limits)
on 127.0.0.1, and ``--clients`` clients send, back to back for ``--seconds``, the largest request the server
admits there: for /v1/embeddings 2,048 texts (--max-inputs) of 64 tokens (--max-request-tokens);
for /v1/layers every hidden state in float32, as many tokens as the response bound allows
(--max-response-mb), as JSON and as application/x-npz; for /v1/explore/tokens and /attention a
text of --max-explore-tokens tokens. Meanwhile the RSS of the HTTP process and of the model process
is read every 20 ms; the script reports each one's peak (and the kernel's high-water mark,
VmHWM, of the HTTP process), and how many requests got which status
(429s are the queue's byte and token bounds at work). Results: benchmarks/results/serve_bounds.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import process_tree, rss_kib, start_serve, write_result  # noqa: E402


def largest_requests(encoder) -> dict[str, tuple[str, dict, dict]]:
    """endpoint name -> (path, JSON body, headers): the largest request the default limits admit."""
    from layerwise._inputs.raw import normalize_inputs
    from layerwise.serve import ServeSettings

    limits = ServeSettings()
    word = "bank"  # one token

    def text_of(tokens: int) -> str:  # [CLS] + words + [SEP]
        return " ".join([word] * (tokens - 2))

    per_token = encoder.n_hidden_states * encoder.hidden_size * 4  # float32, every layer
    json_tokens = int(limits.max_response_bytes / (per_token * 4 / 3))
    npz_tokens = int(limits.max_response_bytes / per_token)
    inputs = 64
    explore = text_of(limits.max_explore_tokens)
    requests = {
        "embeddings": ("/v1/embeddings", {"input": [text_of(64)] * limits.max_inputs}, {}),
        "layers_json": (
            "/v1/layers",
            {"texts": [text_of(json_tokens // inputs)] * inputs, "layers": "all"},
            {},
        ),
        "layers_npz": (
            "/v1/layers",
            {"texts": [text_of(npz_tokens // inputs)] * inputs, "layers": "all"},
            {"accept": "application/x-npz"},
        ),
        "explore_tokens": ("/v1/explore/tokens", {"text": explore}, {}),
        "explore_attention": ("/v1/explore/attention", {"text": explore, "layer": 3}, {}),
    }
    for name, (_, body, _) in requests.items():
        texts = body.get("input") or body.get("texts") or [body["text"]]
        n = sum(len(item) for item in encoder.inputs.encode(normalize_inputs(texts), truncate=False))
        body_bytes = len(json.dumps(body))
        print(f"{name}: {len(texts)} input(s), {n:,} tokens, body {body_bytes / 2**20:.1f} MiB")
    return requests


class Sampler:
    """RSS of the server and of its model process, every ``interval`` seconds, in a thread."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.pid, self.interval = pid, interval
        self.peaks: dict[str, int] = {"http": 0, "model": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.peaks = {"http": 0, "model": 0}
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                tree = process_tree(self.pid)
                self.peaks["http"] = max(self.peaks["http"], rss_kib(tree[0]))
                model = sum(rss_kib(p) for p in tree[1:])
                self.peaks["model"] = max(self.peaks["model"], model)
            except (FileNotFoundError, ProcessLookupError):
                pass
            time.sleep(self.interval)


async def load(url: str, path: str, body: dict, headers: dict, clients: int, seconds: float) -> dict:
    import httpx

    statuses: collections.Counter = collections.Counter()
    payload = json.dumps(body).encode()
    deadline = time.perf_counter() + seconds

    async def one_client(client) -> None:
        while time.perf_counter() < deadline:
            response = await client.post(
                path, content=payload, headers={"content-type": "application/json", **headers}
            )
            await response.aread()
            statuses[response.status_code] += 1
            if response.status_code == 429:
                await asyncio.sleep(float(response.headers.get("retry-after", "1")))

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await asyncio.gather(*(one_client(client) for _ in range(clients)))
    return dict(sorted(statuses.items()))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--endpoints", default="", help="some of them, comma-separated (default: every one)")
    parser.add_argument("--out", type=Path, default=None, help="Write the results here instead")
    args = parser.parse_args()
    import layerwise as lw

    encoder = lw.Encoder(device="cpu")
    requests = largest_requests(encoder)
    if args.endpoints:
        requests = {name: requests[name] for name in args.endpoints.split(",")}
    rows = {}
    for name, (path, body, headers) in requests.items():
        process, url = start_serve()  # a fresh server per endpoint: each peak is that endpoint's own
        try:
            idle = {
                "http": rss_kib(process.pid),
                "model": sum(rss_kib(p) for p in process_tree(process.pid)[1:]),
            }
            started = time.perf_counter()
            with Sampler(process.pid) as sampler:
                statuses = asyncio.run(load(url, path, body, headers, args.clients, args.seconds))
            high = {
                "http": rss_kib(process.pid, "VmHWM"),
                "model": sum(rss_kib(p, "VmHWM") for p in process_tree(process.pid)[1:]),
            }
        finally:
            process.terminate()
            process.wait(60)
        rows[name] = {
            "path": path,
            "statuses": statuses,
            "seconds": round(time.perf_counter() - started, 1),
            "idle_rss_mib": {k: round(v / 1024) for k, v in idle.items()},
            "peak_rss_mib": {k: round(v / 1024) for k, v in sampler.peaks.items()},
            "high_water_mib": {k: round(v / 1024) for k, v in high.items()},
        }
        peaks, hwm = rows[name]["peak_rss_mib"], rows[name]["high_water_mib"]
        print(
            f"{name:18} {statuses!s:30} RSS idle {idle['http'] // 1024:,}/{idle['model'] // 1024:,} MiB, "
            f"peak HTTP {peaks['http']:,} MiB (high water {hwm['http']:,}), model {peaks['model']:,} MiB"
        )
    result = {
        "clients": args.clients,
        "seconds_per_endpoint": args.seconds,
        "endpoints": rows,
    }
    write_result("serve_bounds", result, args.out)


if __name__ == "__main__":
    main()
