"""Extraction on Ray Data: pooled vectors as a dataset column, token/word level as a sharded store.

    import ray, layerwise as lw
    ds = ray.data.read_text("corpus/")
    settings = lw.Settings(model_dtype="bfloat16")                 # the model, and how it runs
    plan = lw.OutputPlan.parse(layers="last4", pool="sentence:mean", fuse="concat_last4")
    ds = lw.ray.embed(ds, settings, plan, column="text")
    lw.ray.extract_to_store(settings, ds, "corpus.lw", lw.OutputPlan.parse(layers="all"), column="text")
    store = lw.open_store("corpus.lw")          # the shards read as one, in input order

Actors of an ``ActorPoolStrategy`` each load the model once, from the driver's
:class:`~layerwise.Settings` (every field: dtype, max length, batch size, final norm, …). Pooled
outputs travel as Arrow columns. Token- and word-level outputs never go through Ray's object
store: the input is cut into shards of consecutive texts, each shard is written by one actor with
the crash-safe store writer, and only a small metadata row comes back. Rerunning the same call
resumes: finished shards are skipped, a shard a dead actor left half-written resumes from its last
commit (Ray retries the task on a restarted actor). Needs the ``distributed`` extra:
pip install 'layerwise[distributed]'.
"""

from ._actors import EmbedActor, ShardWriter
from ._cache import CacheShardWriter, cache_activations
from ._drivers import MAX_SHARD_SIZE, PLANNED_SIZES, ShardedSummary, auto_shard_size, embed, extract_to_store
from ._runtime import init

__all__ = [
    "MAX_SHARD_SIZE",
    "PLANNED_SIZES",
    "CacheShardWriter",
    "EmbedActor",
    "ShardWriter",
    "ShardedSummary",
    "auto_shard_size",
    "cache_activations",
    "embed",
    "extract_to_store",
    "init",
]
