"""The Ray runs of tests/test_ray.py, executed in a network namespace that has only loopback
(Ray listens on all interfaces and probes the network for its address):

    unshare -n sh -c 'ip link set lo up && python tests/ray_checks.py TEXTS.txt OUT_DIR DECODER'

1. ``layerwise extract TEXTS.txt -o OUT/cli.lw --ray local --workers 2`` (the CLI, in a subprocess);
   then the same command SIGKILLed mid-run and run again (resume);
2. the Python API with an actor that dies in the middle of its first shard (os._exit);
3. ``lw.ray.embed`` over a Ray Dataset, saved for comparison with ``Encoder().embed``; the same
   with the tiny decoder LM in the folder DECODER (its middle layer, last-token pooling);
4. ``lw.ray.cache_activations``: an activation cache written by two actors.
The test compares the results with single-process runs outside the namespace.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

import layerwise as lw
from layerwise.ray import ShardWriter

CACHE_OPTIONS = lw.CacheOptions(layers="0.5,-1", context=32, tokens=32 * 60, shard_bytes=200_000)


class DyingWriter(ShardWriter):
    """Kills its own process half a second into the first shard it writes (once per run)."""

    def write_shard(self, index, texts, text_pairs, ids=None):
        marker = self.path.parent / "died-once"
        if not marker.exists():
            marker.write_text(str(index))
            threading.Timer(0.5, os._exit, [1]).start()
        return super().write_shard(index, texts, text_pairs, ids)


def main() -> None:
    source, out, decoder = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    texts = source.read_text(encoding="utf-8").splitlines()
    report: dict = {}
    cli = [sys.executable, "-m", "layerwise.cli", "extract", str(source), "-o", str(out / "cli.lw"),
           "--ray", "local", "--workers", "2", "--shard-size", "128", "--quiet"]  # fmt: skip
    report["cli_returncode"] = subprocess.run(cli, capture_output=True, text=True).returncode

    # the driver is SIGKILLed once its first shard is on disk; the same command then finishes the rest
    resume = [*cli[:6], str(out / "resume.lw"), *cli[7:]]
    driver = subprocess.Popen(
        resume, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 240
    while (
        time.time() < deadline
        and driver.poll() is None
        and not list((out / "resume.lw").glob("shard-*.lw/offsets"))
    ):
        time.sleep(0.2)
    time.sleep(1.0)
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and the local Ray it started
    driver.wait()
    report["shards_before_resume"] = len(list((out / "resume.lw").glob("shard-*.lw")))
    report["resume_returncode"] = subprocess.run(resume, capture_output=True, text=True).returncode

    lw.ray.init("local", workers=2)
    # a Parquet corpus with ids: the driver plans from one streamed pass, each actor reads its rows
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"doc": [f"d{i}" for i in range(len(texts))], "body": texts})
    pq.write_table(table, out / "corpus.parquet", row_group_size=64)
    corpus = lw.Corpus(out / "corpus.parquet", text_column="body", id_column="doc", limit=300)
    settings = lw.Settings()  # the packaged model
    pooled = lw.OutputPlan.parse(pool="sentence:mean")
    parquet = lw.ray.extract_to_store(settings, corpus, out / "parquet.lw", pooled, workers=2, shard_size=100)
    report["parquet_n_texts"] = parquet.n_texts
    # texts cut at 8 tokens: the driver says so once, with the whole run's count (#55, 9)
    import logging

    warned: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warned.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("layerwise").addHandler(handler)
    cut = lw.ray.extract_to_store(lw.Settings(max_length=8), texts[:40], out / "cut.lw", pooled, workers=2,
                                  shard_size=20)  # fmt: skip
    logging.getLogger("layerwise").removeHandler(handler)
    report["cut_truncated"], report["cut_warnings"] = cut.n_truncated, warned
    words = lw.OutputPlan.parse(layers="0,-1", pool="word:mean", dtype="float16")
    summary = lw.ray.extract_to_store(
        settings, texts, out / "killed.lw", words, workers=2, shard_size=100, writer=DyingWriter
    )
    report["killed_marker"] = (out / "died-once").exists()
    report["killed_n_texts"] = summary.n_texts

    import ray

    ds = ray.data.from_items([{"text": t} for t in texts[:200]])
    pooled = lw.OutputPlan.parse(layers="last4", pool="sentence:mean", fuse="concat_last4")
    embedded = lw.ray.embed(ds, settings, pooled, workers=2, batch_size=64)
    rows = embedded.take_all()
    np.save(out / "embed.npy", np.stack([r["embedding"] for r in rows]))
    report["embed_texts"] = [r["text"] for r in rows]
    by_decoder = lw.ray.embed(
        ds, lw.Settings(str(decoder)), lw.OutputPlan.parse(layers="0.5", pool="sentence:last"), workers=2
    )
    rows = by_decoder.take_all()
    np.save(out / "decoder.npy", np.stack([r["embedding"] for r in rows]))
    report["decoder_texts"] = [r["text"] for r in rows]
    # every setting that changes the numbers reaches the actors: bfloat16 weights, a 12-token cut, the
    # final norm on every state (the middle layer's last token moves under each of the three)
    chosen = lw.Settings(str(decoder), model_dtype="bfloat16", max_length=12, final_norm="all")
    rows = lw.ray.embed(
        ds, chosen, lw.OutputPlan.parse(layers="0.5", pool="sentence:last"), workers=2
    ).take_all()
    np.save(out / "decoder_settings.npy", np.stack([r["embedding"] for r in rows]))
    report["decoder_settings_texts"] = [r["text"] for r in rows]
    # 4. the activation cache: the driver's token pass, each actor every other shard
    cached = lw.ray.cache_activations(settings, source, out / "cache-ray", CACHE_OPTIONS, workers=2)
    report["cache_shards"], report["cache_written"] = cached.n_shards, cached.n_written
    (out / "report.json").write_text(json.dumps(report), encoding="utf-8")


if __name__ == "__main__":
    main()
