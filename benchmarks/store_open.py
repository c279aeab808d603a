"""Opening a store costs the same for 10,000 texts as for 2,000,000.

    python benchmarks/store_open.py [--small 10000] [--large 2000000] [--keep DIR]

Builds two sentence-level stores with ``layerwise extract --layers 0 --pool sentence:mean`` (the
quickest way to many texts: the pipeline and the store are the ones every extraction uses) on
synthetic 8-word lines, then, each in a fresh process: imports (the floor), ``lw.open_store``,
``len``, ``store[n - 1]``, a 1,000-text slice ``store[n // 2 : n // 2 + 1000]``, and ``store.ids[-1]``,
with seconds and resident memory (VmRSS) after each step. For comparison, in the same run, what
opening cost before stores opened lazily: reading the whole manifest (every part, every column),
as ``read_manifest`` still does for ``store.manifest``. Results go to
benchmarks/results/store_open.json. ``--keep DIR`` keeps the stores (and reuses them on a rerun).
"""

from __future__ import annotations

import json
import os
import random
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
from common import write_result  # noqa: E402

PROBE = r"""
import json, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
import numpy, pyarrow.parquet, zarr, layerwise as lw
from layerwise.store._parts import read_manifest
steps = {"imports": (0.0, rss())}
path, whole = sys.argv[1], sys.argv[2] == "whole"
t = time.perf_counter()
if whole:
    import pathlib
    store = lw.open_store(path)
    table = read_manifest(pathlib.Path(path), len(store))
    steps["read whole manifest"] = (time.perf_counter() - t, rss())
else:
    store = lw.open_store(path); steps["open"] = (time.perf_counter() - t, rss())
    t = time.perf_counter(); n = len(store); steps["len"] = (time.perf_counter() - t, rss())
    t = time.perf_counter(); store[n - 1]; steps["store[n-1]"] = (time.perf_counter() - t, rss())
    t = time.perf_counter(); rows = store[n // 2 : n // 2 + 1000]; assert len(rows) == 1000
    steps["1000-text slice"] = (time.perf_counter() - t, rss())
    t = time.perf_counter(); store.ids[-1]; steps["ids[-1]"] = (time.perf_counter() - t, rss())
print(json.dumps({k: {"seconds": round(s, 4), "rss_mib": round(m, 1)} for k, (s, m) in steps.items()}))
"""


def build(folder: Path, n_texts: int) -> tuple[Path, float]:
    store = folder / f"s{n_texts}.lw"
    if (store / "zarr.json").exists():
        return store, 0.0
    rng = random.Random(0)
    words = "the of and to in a is that for it as was with be by on not he this are".split()
    corpus = folder / f"t{n_texts}.txt"
    with open(corpus, "w", encoding="utf-8") as handle:
        for i in range(n_texts):
            handle.write(" ".join(rng.choice(words) for _ in range(7)) + f" w{i}\n")
    started = time.perf_counter()
    command = [
        "layerwise",
        "extract",
        str(corpus),
        "-o",
        str(store),
        "--layers",
        "0",
        "--pool",
        "sentence:mean",
    ]
    subprocess.run([*command, "--quiet"], check=True, stdout=subprocess.DEVNULL)
    corpus.unlink()
    return store, time.perf_counter() - started


def probe(store: Path, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(store), mode], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = common_parser(__doc__)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=2_000_000)
    parser.add_argument("--keep", type=Path, default=None)
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="lw-open-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    report: dict = {"command": "python benchmarks/store_open.py " + " ".join(sys.argv[1:]), "stores": {}}
    try:
        for n in (args.small, args.large):
            store, seconds = build(folder, n)
            parts = len(list((store / "manifest").glob("part-*.parquet")))
            lazy, whole = probe(store, "lazy"), probe(store, "whole")
            report["stores"][str(n)] = {"build_seconds": round(seconds, 1), "manifest_parts": parts,
                                        "lazy": lazy, "whole_manifest": whole}  # fmt: skip
            floor = lazy["imports"]["rss_mib"]
            print(f"{n:>9} texts ({parts} manifest parts): imports {floor:.0f} MiB")
            for step, value in lazy.items():
                print(f"   {step:<18} {value['seconds']:8.4f} s  RSS {value['rss_mib'] - floor:+7.1f} MiB")
            w = whole["read whole manifest"]
            print(
                f"   {'(whole manifest)':<18} {w['seconds']:8.4f} s  RSS {w['rss_mib'] - whole['imports']['rss_mib']:+7.1f} MiB"
            )
        small, large = (report["stores"][str(n)]["lazy"] for n in (args.small, args.large))
        last = list(small)[-1]
        report["rss_large_over_small"] = round(large[last]["rss_mib"] / small[last]["rss_mib"], 4)
        report["open_seconds_large"] = large["open"]["seconds"]
        print(f"RSS after every step, {args.large} vs {args.small} texts: x{report['rss_large_over_small']:.3f}; "
              f"open {large['open']['seconds']:.3f} s")  # fmt: skip
        write_result("store_open", report)
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
