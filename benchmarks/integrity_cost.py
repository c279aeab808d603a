"""What checking every byte costs: each checked read beside the same read without checks.

    python benchmarks/integrity_cost.py [--sentences 4000] [--rounds 5]

One store (the default model, every hidden state of every token, float16) and one activation cache
(hidden states 3 and 6, float16) of UD EWT train sentences are written once. Then, in the same
process, medians of ``--rounds`` interleaved rounds of warm reads (the files in the page cache):

- ``store.array(-1).iter_chunks(8192)``: every row of the last layer, each text's rows checked
  against its CRC-32, beside the strongest unchecked read: zarr's own ``data[a:b, -1]`` in the same
  blocks of rows;
- ``store[:]``: every text as a LayerStack (manifest part checked against the CRC-32 in its name,
  each text's rows against its checksum, its text against its SHA-1);
- ``lw.verify_store``: every check there is;
- ``lw.load_cache(path)`` (record, index files and every shard's bytes checked, then
  ``datasets.load_from_disk``) beside ``datasets.load_from_disk`` alone, each followed by one pass
  over every activation (what a trainer reads);
- ``lw.verify_cache``.

Results go to benchmarks/results/integrity_cost.json.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import mixed_corpus, write_result  # noqa: E402
from common import parser as common_parser  # noqa: E402


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = common_parser(__doc__)
    parser.add_argument("--sentences", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import datasets

    import layerwise as lw

    texts = mixed_corpus(args.sentences, 0)
    work = Path(tempfile.mkdtemp(prefix="lw-integrity-"))
    try:
        encoder = lw.Encoder(device="cpu")
        lw.extract_to_store(encoder, texts, work / "s.lw", lw.OutputPlan(dtype="float16"), progress=False)
        lw.cache_activations(
            encoder,
            texts,
            work / "acts",
            lw.CacheOptions(layers="3,6", context=128, tokens=10**9),
            progress=False,
        )
        store = lw.open_store(work / "s.lw")
        data, rows, last = store.data, store.n_rows, len(store.layers) - 1
        n_bytes = rows * int(np.prod(data.shape[1:])) * data.dtype.itemsize

        def unchecked_chunks() -> None:
            for lo in range(0, rows, 8192):
                np.asarray(data[lo : min(lo + 8192, rows), last])

        def checked_chunks() -> None:
            for _ in lw.open_store(work / "s.lw").array(-1).iter_chunks(8192):
                pass

        def every_text() -> None:
            lw.open_store(work / "s.lw")[:]

        def verify_store() -> None:
            assert lw.verify_store(work / "s.lw").ok

        def read_all(dataset) -> None:
            for batch in dataset.with_format("numpy").iter(batch_size=512):
                for values in batch.values():
                    np.asarray(values).sum()

        def load_cache() -> None:
            read_all(lw.load_cache(work / "acts"))

        def load_from_disk() -> None:
            read_all(datasets.load_from_disk(str(work / "acts")))

        def verify_cache() -> None:
            assert lw.verify_cache(work / "acts").ok

        runs = {
            "store_rows_unchecked": unchecked_chunks, "store_rows_checked": checked_chunks,
            "store_every_text": every_text, "verify_store": verify_store,
            "cache_load_from_disk_and_read": load_from_disk, "cache_load_cache_and_read": load_cache,
            "verify_cache": verify_cache,
        }  # fmt: skip
        for fn in runs.values():  # warm: files in the page cache, imports done
            fn()
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, fn in runs.items():
                seconds[name].append(timed(fn))
        median = {name: statistics.median(values) for name, values in seconds.items()}
        cache_bytes = sum(p.stat().st_size for p in (work / "acts").glob("data-*.arrow"))
        result = {
            "store": {"texts": len(store), "rows": rows, "bytes": n_bytes, "layers": len(store.layers)},
            "cache_bytes": cache_bytes,
            "seconds": median,
            "rounds": seconds,
            "ratios": {
                "bulk_rows_checked_over_unchecked": median["store_rows_checked"]
                / median["store_rows_unchecked"],
                "load_cache_over_load_from_disk": (
                    median["cache_load_cache_and_read"] / median["cache_load_from_disk_and_read"]
                ),
            },
            "throughput_mb_s": {
                "store_rows_checked": n_bytes / median["store_rows_checked"] / 1e6,
                "verify_store": n_bytes / median["verify_store"] / 1e6,
                "verify_cache": cache_bytes / median["verify_cache"] / 1e6,
            },
        }
        for name, value in median.items():
            print(f"{name:34s} {value:8.3f} s")
        for name, value in result["ratios"].items():
            print(f"{name:34s} {value:8.2f}x")
        for name, value in result["throughput_mb_s"].items():
            print(f"{name:34s} {value:8.0f} MB/s")
        write_result("integrity_cost", result)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
