"""The writers alone, with no model: do the store's and the cache's writers keep up with the disk?

    python benchmarks/writer_speed.py [--mb 1024] [--repeats 3] [--folder DIR] [--profile]

Synthetic float16 states of BERT-base shape (13 hidden states x 768) go straight into each writer,
beside ``dd`` writing as many bytes with fsync into the same folder (the disk's limit):

- ``dd``: ``dd if=/dev/zero bs=16M conv=fsync``;
- ``store``: the store writer's own path for every token's states: each text's rows (UD EWT-like
  lengths, 5 to 60 tokens) checksummed (CRC-32), buffered into shards, and written by its committer
  thread with the manifest and the commit marker; then ``os.sync`` so that the figure counts bytes
  on the disk, as dd's does;
- ``cache``: the activation cache's shard writer (Arrow IPC, CRC-32 as the bytes pass, fsync),
  shards of 128-token contexts with three hidden states of 768.

Interleaved rounds, medians; each writer's MB/s and its share of dd's. ``--profile`` prints where
each writer's thread spends its time (cProfile of one round, on the thread that writes).
Results: benchmarks/results/writer_speed.json.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import parser, write_result

LAYERS, WIDTH = 13, 768
TARGET = 0.8  # of dd's rate (issue 64)


def dd_rate(folder: Path, megabytes: int) -> float:
    """MB/s of dd writing ``megabytes`` with fsync into ``folder``."""
    target = folder / "dd.bin"
    started = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=16M", f"count={max(1, megabytes // 16)}", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    seconds = time.perf_counter() - started
    target.unlink()
    return max(1, megabytes // 16) * 16 * 2**20 / 1e6 / seconds


def synthetic_texts(megabytes: int, seed: int = 0) -> list[np.ndarray]:
    """Token-major float16 rows ``(n_tokens, 13, 768)`` of texts of 5 to 60 tokens, ``megabytes`` in all."""
    rng = np.random.default_rng(seed)
    row_bytes = LAYERS * WIDTH * 2
    texts, total = [], 0
    pool = rng.standard_normal((4096, LAYERS, WIDTH)).astype(np.float16)  # shared values: cheap to make
    while total < megabytes * 2**20:
        n = int(rng.integers(5, 61))
        start = int(rng.integers(0, len(pool) - n))
        texts.append(np.ascontiguousarray(pool[start : start + n]))
        total += n * row_bytes
    return texts


def write_store(folder: Path, texts: list[np.ndarray]) -> float:
    """Seconds for the store writer's path (checksum, shard buffer, committer) to write ``texts``."""
    import zarr

    from layerwise.store._commit import Committer, ShardBuffer
    from layerwise.store._format import OFFSETS, StoreLayout
    from layerwise.store._verify import rows_checksum
    from layerwise.store._writer import StoreWriter

    path = folder / "w.lw"
    layout = StoreLayout()
    shard_rows = layout.chunk_rows * layout.shard_chunks
    fake = types.SimpleNamespace(
        meta={"format": "synthetic"}, chunk_rows=layout.chunk_rows, shard_rows=shard_rows,
        dtype="float16", n_texts=len(texts), path=path, _row_shape=lambda: (LAYERS, WIDTH),
    )  # fmt: skip
    started = time.perf_counter()
    group = StoreWriter._create(fake)  # type: ignore[arg-type]  # the writer's own layout, no model
    group = zarr.open_group(str(path), mode="r+")
    assert group[OFFSETS].shape == (1,)
    buffer = ShardBuffer(shard_rows, "float16", start=0, position=0, end=0)
    committer = Committer(group, path)
    committer.start()
    for text_id, rows in enumerate(texts):
        record = {"text_id": text_id, "id": text_id, "text": "", "text_pair": None, "text_sha1": "",
                  "truncated": False, "n_windows": 1, "crc32": rows_checksum(rows)}  # fmt: skip
        committer.submit(buffer.append(rows, record))
    committer.submit(buffer.flush(final=True))
    committer.close()
    os.sync()
    seconds = time.perf_counter() - started
    shutil.rmtree(path)
    return seconds


def write_cache(folder: Path, shards: list[dict[str, np.ndarray]], token_ids: np.ndarray) -> float:
    """Seconds for the cache's shard writer to write ``shards``, one after another."""
    from layerwise._cache.format import features
    from layerwise._cache.shards import write_shard

    out = folder / "w.cache"
    out.mkdir()
    schema = features(dict.fromkeys(shards[0], WIDTH), token_ids.shape[1], "float16")
    started = time.perf_counter()
    for k, arrays in enumerate(shards):
        write_shard(out, f"data-{k:05d}-of-{len(shards):05d}.arrow", schema, arrays, token_ids)
    seconds = time.perf_counter() - started
    shutil.rmtree(out)
    return seconds


def cache_shards(megabytes: int, context: int = 128) -> tuple[list[dict[str, np.ndarray]], np.ndarray]:
    """Three hidden-state columns of (contexts, 128, 768) float16 per shard, ~256 MB a shard."""
    rng = np.random.default_rng(1)
    per_shard = 256 * 2**20 // (3 * context * WIDTH * 2)
    column = rng.standard_normal((per_shard, context, WIDTH)).astype(np.float16)
    n_shards = max(1, megabytes // 256)
    token_ids = rng.integers(0, 30522, (per_shard, context)).astype(np.int32)
    shards = [{f"blocks.{i}.hook_resid_post": column for i in (3, 6, 9)} for _ in range(n_shards)]
    return shards, token_ids


def crc_rates(megabytes: int = 256) -> dict[str, float]:
    """MB/s of CRC-32 over one buffer: Python's zlib (the system zlib) and the one the writers use."""
    import zlib

    from layerwise.store._checksum import IMPLEMENTATION, crc32

    data = np.random.default_rng(2).integers(0, 256, megabytes * 2**20, dtype=np.uint8)
    rates = {}
    for name, fn in (("zlib", zlib.crc32), (f"layerwise ({IMPLEMENTATION})", crc32)):
        fn(data[: 2**20])
        started = time.perf_counter()
        fn(data)
        rates[name] = round(data.nbytes / 1e6 / (time.perf_counter() - started))
    return rates


def profiled(fn, *args) -> list[str]:
    """The top functions, by time spent in them, of every thread ``fn`` runs (cProfile per thread)."""
    profiles: list[cProfile.Profile] = []

    def trace(*_):  # a profile for each thread started while fn runs
        profile = cProfile.Profile()
        profiles.append(profile)
        profile.enable()

    threading.setprofile(trace)
    main = cProfile.Profile()
    try:
        main.runcall(fn, *args)
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        for p in profiles:
            p.disable()
    stats = pstats.Stats(main)
    for p in profiles:
        stats.add(p)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:8]  # type: ignore[attr-defined]
    return [
        f"{tottime:.3f} s  {name} ({Path(file).name}:{line})"
        for (file, line, name), (_, _, tottime, _, _) in rows
    ]


def main() -> None:
    args_parser = parser(__doc__)
    args_parser.add_argument("--mb", type=int, default=1024, help="megabytes each contender writes")
    args_parser.add_argument("--repeats", type=int, default=3)
    args_parser.add_argument("--folder", type=Path, default=None, help="where to write (default: a temp dir)")
    args_parser.add_argument("--profile", action="store_true")
    args_parser.add_argument(
        "--crc",
        choices=["fast", "zlib"],
        default="fast",
        help="zlib: the writers with Python's zlib CRC-32 (zlib-ng hidden), for comparison",
    )
    args_parser.add_argument("--output", type=Path, default=None, help="the result file (default: results/)")
    args = args_parser.parse_args()
    if args.crc == "zlib":
        sys.modules["zlib_ng"] = None  # type: ignore[assignment]  # layerwise falls back to zlib
    import torch  # noqa: F401  (loaded in every writing process: the store's cast path uses it)

    folder = Path(tempfile.mkdtemp(prefix="lw-writers-", dir=args.folder))
    texts = synthetic_texts(args.mb)
    store_bytes = sum(t.nbytes for t in texts)
    shards, token_ids = cache_shards(args.mb)
    cache_bytes = sum(sum(a.nbytes for a in s.values()) + token_ids.nbytes for s in shards)
    rates: dict[str, list[float]] = {"dd": [], "store": [], "cache": []}
    try:
        for _ in range(args.repeats):
            rates["dd"].append(dd_rate(folder, args.mb))
            rates["store"].append(store_bytes / 1e6 / write_store(folder, texts))
            rates["cache"].append(cache_bytes / 1e6 / write_cache(folder, shards, token_ids))
        median = {k: statistics.median(v) for k, v in rates.items()}
        report = {
            "megabytes": args.mb, "repeats": args.repeats, "texts": len(texts), "store_bytes": store_bytes,
            "cache_bytes": cache_bytes, "mb_per_s": {k: round(v) for k, v in median.items()},
            "share_of_dd": {k: round(median[k] / median["dd"], 3) for k in ("store", "cache")},
            "target": TARGET, "rounds": {k: [round(r) for r in v] for k, v in rates.items()}, "crc": args.crc,
        }  # fmt: skip
        report["crc32_mb_per_s"] = crc_rates()
        print("CRC-32:", ", ".join(f"{k} {v:,} MB/s" for k, v in report["crc32_mb_per_s"].items()))
        for key in ("dd", "store", "cache"):
            share = f"  {median[key] / median['dd']:.2f}x dd (target >= {TARGET})" if key != "dd" else ""
            print(f"{key:6s} {median[key]:8,.0f} MB/s{share}")
        if args.profile:
            report["profile"] = {
                "store": profiled(write_store, folder, texts),
                "cache": profiled(write_cache, folder, shards, token_ids),
            }
            for key, lines in report["profile"].items():
                print(key, *lines, sep="\n  ")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    write_result("writer_speed", report, args.output)


if __name__ == "__main__":
    main()
