"""Ray's overhead at equal cores: one process vs Ray actors writing a sharded store.

    python benchmarks/ray_scaling.py [--sentences 8000] [--documents 80]

On this machine's 2 cores, every hidden state of every token of the default model (float16 store)
for a mixed-length UD EWT corpus, three ways, each including model loading:

  (a) one process, 2 torch threads:    lw.extract_to_store(lw.Encoder(), texts, path)
  (b) 2 Ray actors x 1 thread each:    lw.ray.extract_to_store(lw.Settings(), texts, path, workers=2)
  (c) 1 Ray actor x 2 threads:         lw.ray.extract_to_store(lw.Settings(), texts, path, workers=1, threads_per_worker=2)

Ray itself (ray.init) is started once before (b) and (c); its start-up is reported on its own.
Ray runs in a network namespace with only loopback: the script re-runs itself under
``unshare -n`` (root). Prints tokens/s and the ratio to (a); results: benchmarks/results/ray_scaling.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import mixed_corpus, write_result  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=8000)
    parser.add_argument("--documents", type=int, default=80)
    args = parser.parse_args()
    if os.environ.get("LAYERWISE_IN_NETNS") != "1":
        command = " ".join([sys.executable, *map(str, sys.argv)])
        script = f"ip link set lo up && LAYERWISE_IN_NETNS=1 {command}"
        sys.exit(subprocess.run(["unshare", "-n", "sh", "-c", script]).returncode)

    import layerwise as lw

    texts = mixed_corpus(args.sentences, args.documents, seed=2)
    scratch = Path(tempfile.mkdtemp(prefix="layerwise-ray-"))
    report: dict = {"n_texts": len(texts)}
    try:
        started = time.perf_counter()
        encoder = lw.Encoder(device="cpu")
        summary = lw.extract_to_store(encoder, texts, scratch / "single.lw", progress=False)
        single = time.perf_counter() - started
        n_tokens = sum(len(s) for s in encoder.tokenize(texts))
        report["n_tokens"] = n_tokens
        report["one_process_2_threads"] = {
            "seconds": round(single, 1),
            "tokens_per_s": round(n_tokens / single),
        }
        print(
            f"(a) 1 process x 2 threads: {single:.1f} s, {n_tokens / single:,.0f} tokens/s ({summary.n_rows} rows)"
        )
        del encoder

        started = time.perf_counter()
        lw.ray.init("local", workers=2)
        report["ray_init_seconds"] = round(time.perf_counter() - started, 1)
        print(f"ray.init: {report['ray_init_seconds']} s")
        for key, workers, threads in (("two_actors_1_thread", 2, 1), ("one_actor_2_threads", 1, 2)):
            started = time.perf_counter()
            result = lw.ray.extract_to_store(
                lw.Settings(), texts, scratch / f"{key}.lw", workers=workers, threads_per_worker=threads
            )
            seconds = time.perf_counter() - started
            ratio = single / seconds
            report[key] = {"seconds": round(seconds, 1), "tokens_per_s": round(n_tokens / seconds),
                           "ratio_to_one_process": round(ratio, 2), "shards": result.n_shards}  # fmt: skip
            print(f"({'b' if workers == 2 else 'c'}) {workers} actor(s) x {threads} thread(s): {seconds:.1f} s, "
                  f"{n_tokens / seconds:,.0f} tokens/s, {ratio:.2f}x of (a), {result.n_shards} shards")  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write_result("ray_scaling", report)


if __name__ == "__main__":
    main()
