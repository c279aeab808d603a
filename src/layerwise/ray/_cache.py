"""The activation cache on Ray: the driver writes the record and the contexts (one token pass),
each actor computes every ``n``-th shard of the permutation with the model the driver's
:class:`~layerwise.Settings` describe, and the driver writes the index once all are there. The
shards are the bytes one process writes (each is a function of its contexts alone), so the
cache reads as one dataset, and a rerun resumes whichever shards are missing."""

from __future__ import annotations

import os
from pathlib import Path

from .._cache.options import CacheOptions
from .._settings.settings import Settings
from ._actors import ModelActor
from ._runtime import import_ray


class CacheShardWriter(ModelActor):
    """Writes the shards ``k % n_workers == worker`` of one cache (one row per worker)."""

    def __init__(self, settings: Settings, threads: int, path: str, meta: dict, n_workers: int) -> None:
        super().__init__(settings, threads)
        self.path, self.meta, self.n_workers = Path(path), meta, n_workers

    def __call__(self, batch: dict) -> dict:
        from .._cache.writer import write_shards

        workers = [int(i) for i in batch["worker"]]
        meta, n = self.meta, self.n_workers
        written = [write_shards(self.encoder, self.path, meta, shards=(i, n)) for i in workers]
        return {"worker": workers, "written": written}


def cache_activations(
    settings: Settings,
    corpus: object,
    path: str | os.PathLike,
    options: CacheOptions | None = None,
    *,
    workers: int = 2,
    threads_per_worker: int = 1,
    writer: type = CacheShardWriter,
):
    """``lw.cache_activations(Encoder.from_settings(settings), corpus, path, options)`` with the
    shards written by ``workers`` Ray actors (start Ray first: ``lw.ray.init``). Returns a
    CacheSummary."""
    import time

    from .._cache.writer import begin_cache, disk_errors, finish_cache, summary_of
    from .._encoder import Encoder
    from ..errors import OptionError

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise OptionError(f"workers={workers!r} must be a whole number >= 1")
    cache_options = CacheOptions() if options is None else options
    if not isinstance(cache_options, CacheOptions):
        raise OptionError(f"options must be a layerwise.CacheOptions, not {type(cache_options).__name__}")
    started = time.perf_counter()
    ray = import_ray()
    # the driver tokenises and checks (it needs the tokenizer and the weights' hash), on the CPU
    driver = Encoder.from_settings(settings.replace(device="cpu") if settings.device == "auto" else settings)
    with disk_errors(Path(path)), begin_cache(driver, corpus, path, cache_options) as meta:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        rows = ray.data.from_items([{"worker": i} for i in range(workers)], override_num_blocks=workers)
        results = rows.map_batches(
            writer,
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=workers),
            fn_constructor_args=(settings, threads_per_worker, str(path), meta, workers),
            num_cpus=threads_per_worker,
            num_gpus=1 if settings.device.startswith("cuda") else 0,
        ).take_all()
        finish_cache(Path(path), meta)
    return summary_of(Path(path), meta, sum(int(r["written"]) for r in results), started)
