"""The HTTP process's CPU per request: `layerwise serve` against a bare ASGI app under the same uvicorn.

    python benchmarks/serve_http_floor.py [--clients 32] [--seconds 10] [--sleep-ms 110]

How much of the server's HTTP-side CPU is uvicorn's own, and how much is layerwise's? The floor is
an ASGI app with no framework, run by the same uvicorn (uvloop and httptools when installed, as
`layerwise serve` gets them). It reads the request body, sleeps ``--sleep-ms`` (so that the request
rate comes out near the real server's at the same client count), and answers with a fixed
embedding body of the same size. Both servers get the same load (serve_load.py's client and texts).
The script prints, for each one, requests/s and CPU milliseconds per request. For `layerwise serve`
that CPU is its HTTP process's alone, without the model process. Results:
benchmarks/results/serve_http_floor.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
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
    free_port,
    load,
    start,
    start_serve,
)

_SLEEP = float(os.environ.get("LAYERWISE_FLOOR_SLEEP_MS", "110")) / 1000
_BODY = json.dumps(
    {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [random.random() for _ in range(384)]}],
        "model": "all-MiniLM-L6-v2",
        "usage": {"prompt_tokens": 20, "total_tokens": 20},
    }
).encode()


async def app(scope, receive, send) -> None:
    """The bare ASGI app (uvicorn imports it from this module: ``serve_http_floor:app``)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            done = message["type"] == "lifespan.shutdown"
            await send({"type": "lifespan.shutdown.complete" if done else "lifespan.startup.complete"})
            if done:
                return
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):  # read the whole request body
        pass
    if scope["path"] == "/v1/embeddings":
        await asyncio.sleep(_SLEEP)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(_BODY)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": _BODY})


def cpu_per_request(pid: int, url: str, texts, tokens, clients: int, seconds: float) -> dict:
    """One load after a 2 s warm-up: requests/s, and the CPU ms per request of the process itself
    (not of its children: `layerwise serve`'s model process is one)."""
    asyncio.run(load(url, texts, tokens, clients, 2.0))
    before = cpu_split(pid)
    row = asyncio.run(load(url, texts, tokens, clients, seconds))
    columns = cpu_columns(before, cpu_split(pid), row)
    return {
        "requests_per_s": row["requests_per_s"],
        "errors": row["errors"],
        "cpu_ms_per_request": columns["http_ms_per_request"],
        "cores": columns["http_cores"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--sleep-ms", type=float, default=110.0, help="The bare app's wait per request")
    parser.add_argument("--out", type=Path, default=RESULTS / "serve_http_floor.json")
    args = parser.parse_args()
    texts, _, tokens = corpus_and_encoder(2000)
    report: dict = {"clients": args.clients, "seconds": args.seconds, "sleep_ms": args.sleep_ms}

    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "serve_http_floor:app", "--app-dir", str(HERE),
               "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]  # fmt: skip
    bare = start(command, port, env={"LAYERWISE_FLOOR_SLEEP_MS": str(args.sleep_ms)})
    try:
        url = f"http://127.0.0.1:{port}"
        report["bare_uvicorn"] = cpu_per_request(bare.pid, url, texts, tokens, args.clients, args.seconds)
    finally:
        bare.terminate()
        bare.wait(60)
    print(f"bare ASGI app under uvicorn: {json.dumps(report['bare_uvicorn'])}", flush=True)

    server, url = start_serve()
    try:
        report["layerwise_http_process"] = cpu_per_request(
            server.pid, url, texts, tokens, args.clients, args.seconds
        )
    finally:
        server.terminate()
        server.wait(60)
    print(f"layerwise serve, HTTP process: {json.dumps(report['layerwise_http_process'])}", flush=True)
    ours = report["layerwise_http_process"]["cpu_ms_per_request"]
    floor = report["bare_uvicorn"]["cpu_ms_per_request"]
    report["layerwise_over_floor"] = round(ours / floor, 2)
    print(f"layerwise's HTTP process: {ours:.3f} ms of CPU per request, {ours / floor:.1f}x the bare app's")
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
