"""Extraction on Ray Data: pooled vectors as a dataset column, token/word level as a sharded store.

    import ray, layerwise as lw
    ds = ray.data.read_text("corpus/")
    ds = lw.ray.embed(ds, column="text", layers="last4", pool="sentence:mean", fuse="concat_last4")
    lw.ray.extract_to_store(ds, "corpus.lw", column="text", plan=lw.OutputPlan.parse(layers="all"))
    store = lw.open_store("corpus.lw")          # the shards read as one, in input order

Actors of an ``ActorPoolStrategy`` each load the model once. Pooled outputs travel as Arrow
columns. Token- and word-level outputs never go through Ray's object store: the input is cut into
shards of consecutive texts, each shard is written by one actor with the crash-safe store writer,
and only a small metadata row comes back. Rerunning the same call resumes: finished shards are
skipped, a shard a dead actor left half-written resumes from its last commit (Ray retries the
task on a restarted actor). Needs the ``distributed`` extra: pip install 'layerwise[distributed]'.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import MissingDependencyError, OptionError
from ..features.plan import OutputPlan

MAX_SHARD_SIZE = 4096


def auto_shard_size(n_texts: int) -> int:
    """About 32 shards (enough to balance a few actors), each 1,024..4,096 texts (smaller shards
    cost more: 256-text shards +11% over one store, 1,024-text +3%, docs/guide/ray.md). A function of
    the corpus alone, so that a rerun with another --workers still resumes."""
    return min(MAX_SHARD_SIZE, max(1024, -(-n_texts // 32)))


def _ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing is sent anywhere
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise MissingDependencyError(
            "Ray extraction needs Ray Data: pip install 'layerwise[distributed]'"
        ) from exc
    return ray


def init(mode: str = "local", *, workers: int = 2, threads_per_worker: int = 1) -> None:
    """Start or join Ray: ``local`` starts one on this machine (loopback, no dashboard);
    ``auto`` joins the running cluster (``ray start`` / RAY_ADDRESS). No-op when Ray is up."""
    ray = _ray()
    if ray.is_initialized():
        return
    if mode == "local":
        ray.init(
            num_cpus=workers * threads_per_worker,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    elif mode == "auto":
        ray.init(address="auto", log_to_driver=False, configure_logging=False)
    else:
        raise OptionError(f"--ray {mode!r}: use 'local' (start Ray here) or 'auto' (join a running cluster)")


class _ModelActor:
    """Loads the Encoder once per actor."""

    def __init__(self, model: str | None, device: str, max_length: int | None, threads: int) -> None:
        import torch

        from ..encoder import Encoder

        torch.set_num_threads(threads)
        self.encoder = Encoder(model, device=device, max_length=max_length)


class EmbedActor(_ModelActor):
    def __init__(
        self,
        model,
        device,
        max_length,
        threads,
        plan: OutputPlan,
        column: str,
        output_column: str,
        long_texts: str,
    ) -> None:
        super().__init__(model, device, max_length, threads)
        self.plan, self.column, self.output_column, self.long_texts = plan, column, output_column, long_texts

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        texts = [str(t) for t in batch[self.column]]
        n = self.encoder.n_hidden_states
        stream = self.encoder.iter_extract(
            texts,
            layers=self.plan.hidden_states(n),
            long_texts=self.long_texts,  # type: ignore[arg-type]
            progress=False,
        )
        rows: list[Any] = [None] * len(texts)
        for index, result in self.plan.apply(stream, n_hidden_states=n):
            rows[index] = result.vector  # type: ignore[union-attr]
        return {**batch, self.output_column: np.stack(rows).astype(self.plan.dtype)}


class ShardWriter(_ModelActor):
    """Writes whole shards (one row of the shard dataset each) with the ordinary store writer."""

    def __init__(
        self,
        model,
        device,
        max_length,
        threads,
        plan: OutputPlan,
        path: str,
        table: dict,
        long_texts: str,
        stride: int | None,
        corpus: Any = None,
    ) -> None:
        super().__init__(model, device, max_length, threads)
        self.plan, self.path, self.table = plan, Path(path), table
        self.long_texts, self.stride, self.corpus = long_texts, stride, corpus

    def __call__(self, batch: dict) -> dict:
        out: dict[str, list] = {"shard": [], "n_texts": [], "n_written": [], "n_rows": [], "seconds": []}
        for row, k in enumerate(batch["shard"]):
            if self.corpus is not None:  # a file corpus: this actor reads its shard's rows itself
                shard = self.table["shards"][int(k)]
                size = shard["stop"] - shard["start"]
                block = next(self.corpus.blocks(size, start=shard["start"], stop=shard["stop"]))
                summary = self.write_shard(int(k), block.texts, block.text_pairs, block.ids)
            else:
                pairs = batch["text_pairs"][row]
                text_pairs = None if pairs is None or len(pairs) == 0 else [str(p) for p in pairs]
                summary = self.write_shard(int(k), [str(t) for t in batch["texts"][row]], text_pairs)
            out["shard"].append(int(k))
            out["n_texts"].append(summary.n_texts)
            out["n_written"].append(summary.n_written)
            out["n_rows"].append(summary.n_rows)
            out["seconds"].append(summary.seconds)
        return out

    def write_shard(
        self, index: int, texts: list[str], text_pairs: list[str] | None, ids: list | None = None
    ):
        from ..store.shard_writer import write_shard

        return write_shard(
            self.encoder, self.path, self.table, index, texts, text_pairs, self.plan,
            long_texts=self.long_texts, stride=self.stride, ids=ids,
        )  # fmt: skip


def _texts_of(data: Any, column: str) -> list[str]:
    """A list of strings as it is, or a Ray Dataset's ``column`` in dataset order."""
    if isinstance(data, list | tuple):
        return list(data)
    ray = _ray()
    if isinstance(data, ray.data.Dataset):
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True
        return [str(row[column]) for row in data.select_columns([column]).iter_rows()]
    raise OptionError(f"data must be a list of texts or a ray.data.Dataset, not {type(data).__name__}")


def _model_shape(model: str | None) -> tuple[str, str, int]:
    """(source, name, n_hidden_states) from the config alone: settings are checked before any actor starts."""
    from transformers import AutoConfig

    from ..model.source import resolve_model_source

    source, name = resolve_model_source(model)
    config = AutoConfig.from_pretrained(source)
    return str(source), name, int(config.num_hidden_layers) + 1


def embed(
    ds: Any,
    *,
    column: str = "text",
    model: str | None = None,
    layers: Any = None,
    pool: str = "sentence:mean",
    fuse: str | None = None,
    special_tokens: str = "include",
    normalize: bool = False,
    dtype: str = "float32",
    output_column: str = "embedding",
    workers: int = 2,
    threads_per_worker: int = 1,
    batch_size: int = 256,
    device: str = "cpu",
    max_length: int | None = None,
    long_texts: str = "truncate",
) -> Any:
    """``ds`` with one more column, ``output_column``: each text's pooled (and fused) vector, as
    ``Encoder().embed`` computes it. Sentence pooling only: token and word vectors go to a store
    (:func:`extract_to_store`)."""
    ray = _ray()
    plan = OutputPlan.parse(
        layers=layers, pool=pool, fuse=fuse, special_tokens=special_tokens, dtype=dtype, normalize=normalize
    )
    if plan.level != "sentence":
        raise OptionError(
            f"pool={pool!r}: lw.ray.embed returns one vector per text (sentence:MODE); token and word "
            "vectors are too large for dataset columns: use lw.ray.extract_to_store"
        )
    _, _, n_hidden = _model_shape(model)
    plan.hidden_states(n_hidden)  # a bad layer spec fails here, not in every actor
    return ds.map_batches(
        EmbedActor,
        batch_size=batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=workers),
        fn_constructor_args=(
            model,
            device,
            max_length,
            threads_per_worker,
            plan,
            column,
            output_column,
            long_texts,
        ),
        num_cpus=threads_per_worker,
        num_gpus=1 if str(device).startswith("cuda") else 0,
    )


@dataclass
class ShardedSummary:
    path: Path
    n_texts: int
    n_shards: int
    n_shards_skipped: int  # already complete when the run started (a resumed run)
    n_written: int
    n_rows: int
    seconds: float


def extract_to_store(
    data: Any,
    path: str | os.PathLike,
    plan: OutputPlan | None = None,
    *,
    column: str = "text",
    text_pairs: Sequence[str] | None = None,
    model: str | None = None,
    workers: int = 2,
    threads_per_worker: int = 1,
    shard_size: int | None = None,
    device: str = "cpu",
    max_length: int | None = None,
    long_texts: str = "truncate",
    stride: int | None = None,
    overwrite: bool = False,
    writer: type = ShardWriter,
) -> ShardedSummary:
    """Extract ``data`` into a sharded store at ``path``: shards of ``shard_size`` consecutive texts
    (default :func:`auto_shard_size`), each written by one actor. Rerun the same call to resume.

    ``data`` is a :class:`~layerwise.Corpus` or a path (read with ``column`` as its text column):
    the driver reads it once, without holding it, to plan the shards (each one's first row and the
    hash of its texts), and each actor reads its own shard's rows; or a list of texts, or a Ray
    Dataset's ``column`` (collected on the driver). ``writer`` is the actor class (tests pass one
    that dies mid-shard)."""
    from ..errors import check_choice
    from ..store.shard_writer import begin_sharded_store

    ray = _ray()
    started = time.perf_counter()
    from ..inputs.corpus import Corpus

    plan = plan if plan is not None else OutputPlan(dtype="float16")
    corpus: Corpus | None = None
    if isinstance(data, str | os.PathLike):
        data = Corpus(data, text_column=None if column == "text" else column)
    if isinstance(data, Corpus):
        corpus, texts = data, []
        n_texts = len(corpus)  # one streamed pass: rows checked and counted, nothing held
    else:
        texts = _texts_of(data, column)
        n_texts = len(texts)
    shard_size = shard_size if shard_size is not None else auto_shard_size(n_texts)
    if text_pairs is not None and len(text_pairs) != n_texts:
        raise OptionError(f"{n_texts} texts but {len(text_pairs)} text_pairs")
    source, name, n_hidden = _model_shape(model)
    plan.hidden_states(n_hidden)  # a bad layer spec fails here, before anything is written
    check_choice("long_texts", long_texts, ("truncate", "window"))
    if stride is not None and long_texts != "window":
        raise OptionError(f"stride={stride} applies to long_texts='window' only")
    path = Path(path)
    table = begin_sharded_store(
        path, model=name, plan=plan, n_hidden_states=n_hidden, texts=corpus or texts, text_pairs=text_pairs,
        shard_size=shard_size, long_texts=long_texts, stride=stride, overwrite=overwrite,
    )  # fmt: skip
    ranges = [(shard["start"], shard["stop"]) for shard in table["shards"]]

    from ..store.sharded import shard_progress

    todo = set(shard_progress(path).pending)  # a resumed run skips complete shards
    rows = [
        {"shard": k}
        if corpus is not None  # the actors read their own rows
        else {
            "shard": k,
            "texts": texts[a:b],
            "text_pairs": list(text_pairs[a:b]) if text_pairs is not None else [],
        }
        for k, (a, b) in enumerate(ranges)
        if k in todo
    ]
    written = []
    if rows:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # redrawing them costs the driver a core on a small machine
        shards = ray.data.from_items(rows, override_num_blocks=len(rows))
        results = shards.map_batches(
            writer,
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=min(workers, len(rows))),
            fn_constructor_args=(
                source,
                device,
                max_length,
                threads_per_worker,
                plan,
                str(path),
                table,
                long_texts,
                stride,
                corpus,
            ),
            num_cpus=threads_per_worker,
            num_gpus=1 if str(device).startswith("cuda") else 0,  # one GPU per actor
            # a dead actor is restarted and its shard retried: the shard resumes from its last commit
            max_restarts=-1,
            max_task_retries=-1,
        )
        written = results.take_all()
    progress = shard_progress(path)  # not ShardedStore(path): that reads every manifest
    if progress.pending:
        raise RuntimeError(f"{path}: {progress.n_texts} of {n_texts} texts after the run; rerun to finish")
    return ShardedSummary(
        path=path,
        n_texts=n_texts,
        n_shards=len(ranges),
        n_shards_skipped=len(ranges) - len(rows),
        n_written=sum(int(r["n_written"]) for r in written),
        n_rows=progress.n_rows,
        seconds=time.perf_counter() - started,
    )
