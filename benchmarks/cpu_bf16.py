"""bfloat16 on the CPU: what it costs in fidelity, and what it buys in speed on this machine.

    python benchmarks/cpu_bf16.py [--texts 200] [--repeats 3] [--models all-MiniLM-L6-v2,bert-base]

For each model (the default all-MiniLM-L6-v2; a random ``BertConfig()``, BERT-base's shapes), on a
mixed-length UD EWT corpus, ``Encoder(model_dtype=...).extract(texts, layers="all")`` in float32 and
in bfloat16 (results always come back in float32):

- fidelity, per hidden state, over every token of the corpus: the worst token's cosine to float32,
  and the token's relative error ``|bf16 - fp32| / |fp32|`` (median and worst);
- speed: each dtype's tokens/s (medians of ``--repeats`` interleaved rounds) and their ratio, beside
  the machine's matrix-product rate in both dtypes (a 1,024² product, the fastest of ``@``,
  ``F.linear`` and oneDNN's prepacked linear) and its bfloat16 matrix units (layerwise._host.cpu).

The fidelity is a property of the numbers (bfloat16 keeps 8 bits of mantissa; every product
accumulates in float32 in torch's CPU kernels), so it holds on any CPU; the speed is this machine's.
Results: benchmarks/results/cpu_bf16.json.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import best_matmul_rate, interleaved_times, mixed_corpus, parser, write_result
from roof import bert_base

import layerwise as lw
from layerwise._host.cpu import bf16_units, vector_units

DTYPES = ("float32", "bfloat16")


def fidelity(reference: list, other: list) -> list[dict]:
    """Per hidden state: the worst token cosine of ``other`` to ``reference``, and the median and
    worst relative error of a token's vector, over every token of every text."""
    rows = []
    for layer in range(reference[0].hidden.shape[0]):
        a = np.concatenate([r.hidden[layer] for r in reference]).astype(np.float64)
        b = np.concatenate([r.hidden[layer] for r in other]).astype(np.float64)
        norms = np.linalg.norm(a, axis=1)
        cosine = (a * b).sum(1) / (norms * np.linalg.norm(b, axis=1))
        relative = np.linalg.norm(b - a, axis=1) / norms
        rows.append(
            {
                "layer": layer,
                "worst_cosine": round(float(cosine.min()), 6),
                "median_relative_error": float(f"{np.median(relative):.3g}"),
                "worst_relative_error": float(f"{relative.max():.3g}"),
            }
        )
    return rows


def measure(name: str, folder: Path, texts: list[str], repeats: int) -> dict:
    encoders = {dtype: lw.Encoder(folder, device="cpu", model_dtype=dtype) for dtype in DTYPES}
    results = {dtype: enc.extract(texts, layers="all", progress=False) for dtype, enc in encoders.items()}
    n_tokens = sum(r.n_tokens for r in results["float32"])
    runs = {
        dtype: (lambda enc=enc: enc.extract(texts, layers="all", progress=False) and n_tokens)
        for dtype, enc in encoders.items()
    }
    times = interleaved_times(runs, repeats, n_tokens)
    speed = {dtype: round(n_tokens / statistics.median(times[dtype])) for dtype in DTYPES}
    rows = fidelity(results["float32"], results["bfloat16"])
    worst = min(row["worst_cosine"] for row in rows)
    ratio = speed["bfloat16"] / speed["float32"]
    print(f"{name}: {len(texts)} texts, {n_tokens} tokens; worst token cosine to float32 {worst:.6f}")
    print(f"  tokens/s: float32 {speed['float32']:,}, bfloat16 {speed['bfloat16']:,} ({ratio:.2f}x)")
    for row in rows:
        print(
            f"  state {row['layer']:>2}: worst cosine {row['worst_cosine']:.6f}, relative error "
            f"median {row['median_relative_error']:.2g}, worst {row['worst_relative_error']:.2g}"
        )
    return {
        "texts": len(texts),
        "tokens": n_tokens,
        "states": rows,
        "worst_cosine": worst,
        "tokens_per_s": speed,
        "bf16_over_fp32": round(ratio, 3),
        "rounds": {k: [round(t, 4) for t in v] for k, v in times.items()},
    }


def main() -> None:
    args_parser = parser(__doc__)
    args_parser.add_argument("--texts", type=int, default=200)
    args_parser.add_argument("--repeats", type=int, default=3)
    args_parser.add_argument("--models", default="all-MiniLM-L6-v2,bert-base")
    args_parser.add_argument("--output", type=Path, default=None, help="the result file (default: results/)")
    args = args_parser.parse_args()
    logging.getLogger("layerwise").setLevel(logging.ERROR)  # the slow-dtype warning is this run's point
    units = bf16_units()
    rates = {dtype: round(best_matmul_rate(getattr(torch, dtype), 1024, 3), 1) for dtype in DTYPES}
    print(f"vector units {vector_units()}, bfloat16 units {units or 'none'}; GFLOP/s {rates}")
    report: dict = {"bf16_units": units, "vector_units": vector_units(), "matmul_gflops": rates, "models": {}}
    texts = mixed_corpus(args.texts, max(1, args.texts // 25))
    with tempfile.TemporaryDirectory(prefix="lw-bf16-") as base:
        folders = {
            "all-MiniLM-L6-v2": lambda: lw.default_model_path(),
            "bert-base": lambda: bert_base(Path(base)),
        }
        for name in args.models.split(","):
            report["models"][name] = measure(name, folders[name](), texts, args.repeats)
    write_result("cpu_bf16", report, args.output)


if __name__ == "__main__":
    main()
