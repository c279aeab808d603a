"""Linear layers on MKL vs oneDNN, and what a forward costs per token by run size.

    python benchmarks/gemm_speed.py [--texts 2000] [--repeats 5]

1. The matmuls of the default model (all-MiniLM-L6-v2: 384 -> 1152 fused QKV, 384 -> 384,
   384 -> 1536, 1536 -> 384) and of the BERT-base shape (768 wide) for 24 to 2,048 rows, on one
   thread: GFLOP/s of ``F.linear`` (torch's CPU wheels run it on MKL) and of oneDNN with the weight
   prepacked once (``torch.ops.mkldnn._linear_pointwise``, what the packed forward uses:
   src/layerwise/_model/forward/cpu_gemm.py), best of ``--repeats``; and a 2048^2 matmul both ways on all of
   torch's threads (the ceiling the other benchmarks divide by).
2. CPU microseconds per token of the default model's forward on one thread (``compute``, as a
   served run: the engine's packed forward, then each input's last layer), for runs of k texts drawn
   at random from the serving benchmark's mixed-length corpus, and for the whole corpus at once
   (length-sorted batches under the token budget), with oneDNN on and off. A served run holds the
   requests that arrived while the other stream computed: about 9 texts at 32 clients
   (benchmarks/serve_load.py), so this is what small runs cost against offline extraction. A least
   squares fit over the small runs splits a run's CPU time into a part every run pays whatever its
   size and a part per token.
3. What a new row count costs: the default model's four matmuls for 200 row counts around 100,
   200, 400 and 800 (a new one each time, as a server's batches are) against the same count 200
   times. MKL has nothing to compile; oneDNN compiles a kernel per shape (then caches a few: 64,
   see src/layerwise/_model/forward/cpu_gemm.py).

The first line printed is the processor's vendor and whether layerwise's default uses oneDNN on it
(``LAYERWISE_ONEDNN`` unset). Results: benchmarks/results/gemm_speed.json (``--out`` to write
elsewhere, e.g. another machine's results).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import best_of, matmul_rates, mixed_corpus, write_result  # noqa: E402

from layerwise._model.forward.cpu_gemm import cpu_vendor, onednn_linear, onednn_wanted, prepack  # noqa: E402

SHAPES = {
    "all-MiniLM-L6-v2": [(384, 1152), (384, 384), (384, 1536), (1536, 384)],
    "BERT-base shape": [(768, 2304), (768, 768), (768, 3072), (3072, 768)],
}
ROWS = (24, 191, 700, 2048)
RUN_SIZES = (1, 4, 9, 17, 32, 64)


def gflops(rows: int, width_in: int, width_out: int, seconds: float) -> float:
    return 2 * rows * width_in * width_out / seconds / 1e9


def linear_rates(repeats: int) -> dict:
    """GFLOP/s of each model's matmul shapes, MKL vs oneDNN prepacked, one thread."""
    out: dict = {}
    for model, shapes in SHAPES.items():
        for rows in ROWS:
            mkl = onednn = 0.0
            for width_in, width_out in shapes:  # the time of the layer's four matmuls together
                x, weight, bias = (
                    torch.randn(rows, width_in),
                    torch.randn(width_out, width_in),
                    torch.randn(width_out),
                )
                packed = prepack(weight)
                mkl += best_of(repeats, lambda: F.linear(x, weight, bias))  # noqa: B023
                onednn += best_of(repeats, lambda: onednn_linear(x, packed, bias))  # noqa: B023
            flop = sum(2 * rows * i * o for i, o in shapes) / 1e9
            out[f"{model}, {rows} rows"] = {
                "mkl_gflops": round(flop / mkl, 1),
                "onednn_gflops": round(flop / onednn, 1),
            }
            print(f"  {model:17s} {rows:5d} rows: MKL {flop / mkl:6.1f} GFLOP/s  oneDNN {flop / onednn:6.1f}"
                  f"  ({mkl / onednn:.2f}x)", flush=True)  # fmt: skip
    return out


def ceiling(repeats: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    mkl, onednn = matmul_rates(2048, repeats)
    print(f"  2048^2 on {threads} threads: MKL {mkl:6.1f} GFLOP/s  oneDNN {onednn:6.1f}", flush=True)
    return {"threads": threads, "mkl_gflops": round(mkl, 1), "onednn_gflops": round(onednn, 1)}


def run_costs(n_texts: int, repeats: int, run_texts: int = 900) -> dict:
    """CPU us per token of one-thread forwards (last layer of each text) by run size, oneDNN on/off;
    about ``run_texts`` texts in the runs of each small size."""
    import layerwise as lw
    from layerwise._inputs.raw import normalize_inputs
    from layerwise._model.forward import cpu_gemm
    from layerwise.serve._batcher import Finish, compute
    from layerwise.serve._jobs import Forward

    torch.set_num_threads(1)
    texts = mixed_corpus(n_texts, max(1, n_texts // 100), seed=1)
    encoder = lw.Encoder(device="cpu", concurrent_forwards=1)
    items = encoder.inputs.encode(normalize_inputs(texts=texts), truncate=True)
    last = (encoder.n_hidden_states - 1,)

    def cost(run: list) -> tuple[float, int]:
        run = [dataclasses.replace(item, index=i) for i, item in enumerate(run)]
        started = time.thread_time()
        forward = Forward(encoder.name, last)
        compute(encoder, forward, run, [Finish(last, None, encoder.n_hidden_states)] * len(run))
        return time.thread_time() - started, sum(len(item) for item in run)

    out: dict = {}
    for backend in ("onednn", "mkl"):
        os.environ["LAYERWISE_ONEDNN"] = "1" if backend == "onednn" else "0"
        cpu_gemm._checked = None  # read the switch again
        cost(items[:64])  # warm up (and pack the weights)
        rows: dict = {}
        samples = []  # (seconds, tokens) of each small run, for the fit below
        for size in [*RUN_SIZES, len(items)]:
            rng = random.Random(size)
            seconds = tokens = 0
            # about 20,000 tokens of small runs (900 texts); the whole corpus ``repeats`` times
            for _ in range(max(repeats, run_texts // size) if size < len(items) else repeats):
                s, t = cost(rng.sample(items, size) if size < len(items) else items)
                seconds, tokens = seconds + s, tokens + t
                if size < len(items):
                    samples.append((s, t))
            key = "whole corpus" if size == len(items) else f"runs of {size}"
            rows[key] = round(1e6 * seconds / tokens, 1)
            print(f"  {backend:6s} {key:13s}: {rows[key]:6.1f} us CPU per token", flush=True)
        rows["fit"] = run_cost_fit(samples)
        print(
            f"  {backend:6s} a run costs {rows['fit']['fixed_ms']} ms + {rows['fit']['us_per_token']} us "
            "per token (least squares over the small runs)"
        )
        out[backend] = rows
    os.environ.pop("LAYERWISE_ONEDNN")
    cpu_gemm._checked = None
    return out


def run_cost_fit(samples: list[tuple[float, int]]) -> dict:
    """Least squares of a run's CPU seconds on (1, tokens): what every run costs whatever its size
    (a new row count's kernels compiled, the weights read from memory, Python and kernel launches
    per op), and each token on top. (Texts as a third term: not separable here, a run's tokens
    grow with its texts.)"""
    import numpy as np

    design = np.array([[1.0, tokens] for _, tokens in samples])
    seconds = np.array([s for s, _ in samples])
    (fixed, per_token), *_ = np.linalg.lstsq(design, seconds, rcond=None)
    return {"fixed_ms": round(1e3 * fixed, 2), "us_per_token": round(1e6 * per_token, 1)}


def new_shape_costs() -> dict:
    """Milliseconds for the default model's four matmuls on one thread: a new row count each call
    (100 counts centred on 100, 200, 400, 800 rows; the ranges do not overlap) vs the centre's count
    every time."""
    shapes = SHAPES["all-MiniLM-L6-v2"]
    weights = [(torch.randn(o, i), torch.randn(o)) for i, o in shapes]
    packed = [(prepack(w), b) for w, b in weights]

    def mkl(x: dict) -> None:
        for weight, bias in weights:
            F.linear(x[weight.shape[1]], weight, bias)

    def onednn(x: dict) -> None:
        for (matrix, bias), (width_in, _) in zip(packed, shapes, strict=True):
            onednn_linear(x[width_in], matrix, bias)

    out: dict = {}
    for centre in (100, 200, 400, 800):
        for name, layer in (("mkl", mkl), ("onednn", onednn)):
            row = {}
            for kind, counts in (("same", [centre] * 100), ("new", range(centre - 50, centre + 50))):
                inputs = [{width: torch.randn(c, width) for width in (384, 1536)} for c in counts]
                if kind == "same":
                    layer(inputs[0])  # compiled once, before the clock
                started = time.perf_counter()
                for x in inputs:
                    layer(x)
                row[f"{kind}_ms"] = round(1000 * (time.perf_counter() - started) / len(inputs), 2)
            row["extra_ms_per_new_count"] = round(row["new_ms"] - row["same_ms"], 2)
            out[f"{name}, about {centre} rows"] = row
            print(f"  {name:6s} about {centre:3d} rows: same count {row['same_ms']:6.2f} ms, a new count "
                  f"{row['new_ms']:6.2f} ms ({row['extra_ms_per_new_count']:+.2f})", flush=True)  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--run-texts", type=int, default=900, help="texts in the runs of each small size")
    parser.add_argument("--out", type=Path, default=None, help="Write the results here instead")
    args = parser.parse_args()
    threads = torch.get_num_threads()
    vendor = cpu_vendor()
    print(f"processor vendor: {vendor}; layerwise's default linear layers here: "
          f"{'oneDNN' if onednn_wanted() else 'F.linear (MKL)'}")  # fmt: skip
    print("matmul shapes, one thread (the four matmuls of a layer together):")
    torch.set_num_threads(1)
    report: dict = {"linear_one_thread": linear_rates(args.repeats)}
    print("ceiling:")
    report["ceiling"] = [ceiling(args.repeats, 1), ceiling(args.repeats, threads)]
    print("forward, one thread, the last layer of each text:")
    report["forward_us_per_token"] = run_costs(args.texts, max(2, args.repeats // 2), args.run_texts)
    print("a layer's four matmuls, one thread, the same row count each call or a new one:")
    report["new_row_counts"] = new_shape_costs()
    report["vendor"], report["default_onednn"] = vendor, onednn_wanted()
    write_result("gemm_speed", report, args.out)


if __name__ == "__main__":
    main()
