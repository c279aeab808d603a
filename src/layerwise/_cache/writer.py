"""``lw.cache_activations``: token activations of several layers, from one forward pass per
context, into a shuffled, resumable ``datasets`` folder that SAE and probe trainers load.

The run, in order (format.py has the layout):

1. every check that can fail on the settings alone (layers, context, tokens, dtype, the output
   folder), before anything is written;
2. the writer lock, then the record (``layerwise-cache.json``): a cache started with other
   settings refuses to resume, naming each difference;
3. the token pass (contexts.py) into ``contexts.i32``: on a resume the corpus is tokenised again
   and must give the same contexts (their SHA-256), or the run refuses;
4. the shards: slot ``s`` of the cache holds context ``permutation[s]`` (a seeded permutation of
   every context of the run, so a contiguous read sees contexts from all over the corpus); shard
   ``k`` holds slots ``k * S .. (k + 1) * S - 1``, computed in fixed batches, written as a hidden temp
   file and renamed, on a thread of its own while the next shard is computed (at most one shard
   waits to be written: memory stays bounded). A killed run loses at most the shards it was
   computing and writing; the rerun skips the shards that exist and computes the others with the
   same batches: the same bytes;
5. ``dataset_info.json`` and ``state.json``: from now on ``datasets.load_from_disk`` opens it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._settings.settings import Settings, numbers_keys
from .._version import __version__
from ..errors import LayerwiseError, OptionError, StoreError
from ..store._lock import remove_lock_if_alone, writer_lock
from .activations import activations
from .contexts import framing_for, read_contexts, write_contexts
from .format import (
    CONTEXTS,
    FORMAT,
    FORMAT_VERSION,
    INFO,
    META,
    STATE,
    checksum_name,
    classify,
    features,
    not_a_cache,
    read_meta,
    remove_owned,
    require_cache_dependencies,
    shard_name,
    write_json,
)
from .load import shard_crcs
from .options import CacheOptions, check_numbers, check_text_model, columns_of
from .shards import file_crc32, write_dataset_index, write_shard

# what must match for a run to resume a cache (the rest of the record says how it ran): the
# weights, the settings that change the numbers (settings.NUMBERS) and the cache's own options
RESUME_KEYS = tuple(
    dict.fromkeys(
        (
            "weights_sha256",
            *numbers_keys(Settings),
            "layers",
            "context",
            "tokens",
            "dtype",
            "shuffle_seed",
            "final_norm",
            "framing",
            "shard_contexts",
            "hooks",
        )
    )
)


@dataclass(frozen=True)
class CacheSummary:
    path: Path
    n_contexts: int
    context: int
    n_shards: int
    n_written: int  # shards written by this run
    columns: tuple[str, ...]
    exhausted: bool  # the corpus ended before the tokens asked for
    seconds: float

    @property
    def n_tokens(self) -> int:
        return self.n_contexts * self.context


def cache_activations(
    encoder: Any,
    corpus: object,
    path: str | os.PathLike,
    options: CacheOptions | None = None,
    *,
    progress: bool | None = None,
) -> CacheSummary:
    """Cache the activations ``options`` name (a :class:`CacheOptions`: the hidden states ``layers``,
    as indices, relative depths such as 0.5 or a spec string "0.25,0.5,0.75"; ``tokens`` tokens cut
    into contexts of ``context``; ``hooks``: the residual stream (``"resid"``) and/or what each
    block's attention and feed-forward add (``"attn_out"``, ``"mlp_out"``); ``shuffle_seed=None``
    keeps source order) of ``corpus`` (a :class:`~layerwise.Corpus`, a path or a list of texts) into
    the folder ``path`` (format.py). Rerun the same call to resume. Returns a :class:`CacheSummary`."""
    started = time.perf_counter()
    options = CacheOptions() if options is None else options
    if not isinstance(options, CacheOptions):
        raise OptionError(f"options must be a layerwise.CacheOptions, not {type(options).__name__}")
    with disk_errors(Path(path)), begin_cache(encoder, corpus, path, options) as meta:
        written = write_shards(encoder, Path(path), meta, progress=progress)
        finish_cache(Path(path), meta)
    return summary_of(Path(path), meta, written, started)


@contextlib.contextmanager
def disk_errors(path: Path) -> Iterator[None]:
    """A write that fails (a full disk, a read-only folder) as a StoreError saying why, what is
    kept (the whole shards) and that a rerun resumes; layerwise's own errors pass as they are."""
    from ..errors import LayerwiseError
    from ..store._commit import disk_error

    try:
        yield
    except OSError as exc:
        if isinstance(exc, LayerwiseError):
            raise
        try:
            meta = read_meta(path) or {}
            n_shards = int(meta.get("n_shards", 0))
            done = sum((path / shard_name(k, n_shards)).exists() for k in range(n_shards))
            kept = f"{done} of {n_shards} shards are written and kept" if n_shards else "nothing is kept yet"
        except Exception:  # the folder itself cannot be read
            kept = "nothing is kept yet"
        raise disk_error("cache", path, exc, kept) from exc


def summary_of(path: Path, meta: dict, written: int, started: float) -> CacheSummary:
    return CacheSummary(
        path,
        meta["n_contexts"],
        meta["context"],
        meta["n_shards"],
        written,
        tuple(meta["columns"]),
        bool(meta["exhausted"]),
        time.perf_counter() - started,
    )


@contextlib.contextmanager
def begin_cache(
    encoder: Any, corpus: object, path: str | os.PathLike, options: CacheOptions
) -> Iterator[dict]:
    """Steps 1-3 of the module docstring: the cache's record, under the writer lock, held until
    the block ends (the shards are written inside it, here or by Ray's actors)."""
    from .._features.layers import resolve_layers
    from .._inputs.corpus import as_corpus
    from .._model.forward.hooks import check_family_taps

    require_cache_dependencies()
    check_text_model(encoder)
    path = Path(path)
    layers, context, tokens, dtype = options.layers, options.context, options.tokens, options.dtype
    shuffle_seed, final_norm, shard_bytes = options.shuffle_seed, options.final_norm, options.shard_bytes
    hidden_states = resolve_layers(layers, encoder.n_hidden_states)  # type: ignore[arg-type]
    check_numbers(encoder, context, tokens, dtype, shuffle_seed, final_norm, shard_bytes)
    if classify(path) == "other":
        raise not_a_cache(path)
    source = as_corpus(corpus)  # a missing file fails here
    n_layers = encoder.n_hidden_states - 1
    columns, sources = columns_of(hidden_states, options.hooks, n_layers, bool(final_norm))
    check_family_taps(encoder.model_type, [h for h in options.hooks if h != "resid"])  # before any file
    framing = framing_for(encoder.tokenizer, encoder.is_decoder)
    framed = len(framing.begin) + len(framing.end)
    if context <= framed:
        raise OptionError(
            f"context={context} leaves no room for text: each context holds {framed} framing token(s) "
            f"({len(framing.begin)} before the text, {len(framing.end)} after); the smallest context that "
            f"works is {framed + 1}: choose --context {framed + 1} or more"
        )
    width_bytes = len(columns) * encoder.hidden_size * np.dtype(dtype).itemsize + 4
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        **_model_record(encoder),
        "layers": list(hidden_states),
        "hooks": list(options.hooks),
        "columns": columns,
        "sources": sources,
        "context": context,
        "tokens": tokens,
        "dtype": dtype,
        "shuffle_seed": shuffle_seed,
        "final_norm": bool(final_norm),
        "framing": framing.as_dict(),
        "shard_contexts": max(1, shard_bytes // (context * width_bytes)),
        "source": source.describe(),
    }
    created = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    with writer_lock(path, "cache"):
        stored = read_meta(path)
        if stored is not None and options.overwrite:
            remove_owned(path)
            stored = None
        if stored is not None:
            different = [k for k in RESUME_KEYS if stored.get(k) != meta.get(k)]
            if different:
                details = "; ".join(f"{k}: cached {stored.get(k)!r}, now {meta.get(k)!r}" for k in different)
                raise StoreError(
                    f"cache {str(path)!r} was written with other settings ({details}); write to a new "
                    "path, or pass --overwrite (Python: overwrite=True) to start it again"
                )
        else:
            write_json(path / META, meta, seal=True)
        try:
            record = _contexts(path, meta, stored, source, encoder, framing, context, tokens)
        except BaseException:
            if stored is None:  # a new cache whose corpus fails its token pass leaves nothing behind
                _remove_begun(path, created)
            raise
        try:
            yield record
        except LayerwiseError:  # refused (a float16 overflow) before its first shard: nothing kept
            if stored is None and not any(n.startswith("data-") for n in os.listdir(path)):
                _remove_begun(path, created)
            raise


def _remove_begun(path: Path, created: bool) -> None:
    """A cache this run began, removed: its own entries, and the folder (with its lock) when this
    run created it."""
    remove_owned(path)
    remove_lock_if_alone(path, created)


def _model_record(encoder: Any) -> dict:
    from .._model.loading.weights_hash import weights_sha256

    return {
        "layerwise_version": __version__,
        "model": encoder.name,
        "model_source": str(encoder.source),
        "weights_sha256": weights_sha256(encoder.models.current),
        "model_dtype": encoder.settings.model_dtype,
        "decoder": encoder.is_decoder,
        "d_model": encoder.hidden_size,
        "n_hidden_states": encoder.n_hidden_states,
    }


def _contexts(
    path: Path, meta: dict, stored: dict | None, source, encoder, framing, context: int, tokens: int
) -> dict:
    """The token pass (module docstring, 3): the record completed with the contexts' count and hash."""
    tmp = path / f".{CONTEXTS}.partial"
    try:
        found = write_contexts(
            (block.texts for block in source.blocks(1024)),
            encoder.tokenizer,
            framing,
            context,
            tokens // context,
            tmp,
        )
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if found.n_contexts == 0:
        tmp.unlink(missing_ok=True)
        raise OptionError(
            f"the corpus holds fewer than {context} tokens ({found.n_documents} documents): no whole "
            "context; choose a smaller --context or a larger corpus"
        )
    if stored is not None and stored.get("contexts_sha256") not in (None, found.sha256):
        tmp.unlink(missing_ok=True)
        raise StoreError(
            f"cache {str(path)!r} was made from other texts: its contexts differ from this corpus' "
            "(contexts_sha256); write to a new path, or pass --overwrite (Python: overwrite=True)"
        )
    os.replace(tmp, path / CONTEXTS)
    n = found.n_contexts
    per_shard = int(meta["shard_contexts"])
    record = {
        **meta,
        "n_contexts": n,
        "n_documents": found.n_documents,
        "contexts_sha256": found.sha256,
        "exhausted": found.exhausted,
        "n_shards": -(-n // per_shard),
    }
    if stored is None or any(stored.get(k) != v for k, v in record.items() if k != "source"):
        write_json(path / META, record, seal=True)
    return record


def permutation(n_contexts: int, seed: int | None) -> np.ndarray:
    """Slot -> context: the cache's order (identity when unshuffled)."""
    if seed is None:
        return np.arange(n_contexts)
    return np.random.default_rng(seed).permutation(n_contexts)


def write_shards(
    encoder: Any,
    path: Path,
    meta: dict,
    *,
    shards: tuple[int, int] | None = None,
    progress: bool | None = None,
) -> int:
    """Step 4: the shards not yet written (of those ``k % n == i`` when ``shards=(i, n)``: one of
    ``n`` workers on one cache), by ``encoder``, which must hold the cache's weights. Called under
    :func:`begin_cache`'s lock. Returns how many it wrote."""
    from .._host.progress import progress_bar
    from .._model.loading.weights_hash import weights_sha256

    if weights_sha256(encoder.models.current) != meta["weights_sha256"]:
        raise StoreError(f"cache {str(path)!r} was begun with other weights than {encoder.name!r} holds")
    n, context, per_shard, n_shards = (
        meta["n_contexts"],
        meta["context"],
        meta["shard_contexts"],
        meta["n_shards"],
    )
    order = permutation(n, meta["shuffle_seed"])
    columns = {name: int(meta["d_model"]) for name in meta["columns"]}
    schema = features(columns, context, meta["dtype"])
    mine = [k for k in range(n_shards) if shards is None or k % shards[1] == shards[0]]
    todo = [k for k in mine if not (path / shard_name(k, n_shards)).exists()]
    bar = progress_bar("caching", "contexts", progress)
    with bar if bar is not None else contextlib.nullcontext():
        done = sum(min(per_shard, n - k * per_shard) for k in mine if k not in todo)
        task = (
            bar.add_task("cache", total=sum(min(per_shard, n - k * per_shard) for k in mine), completed=done)
            if bar
            else None
        )
        # the write (Arrow, fsync) releases the GIL: the next shard's forward runs meanwhile
        with ThreadPoolExecutor(1, thread_name_prefix="layerwise-cache-write") as writer:
            writing: tuple[Future, int] | None = None
            for k in todo:
                slots = order[k * per_shard : min((k + 1) * per_shard, n)]
                token_ids = read_contexts(path / CONTEXTS, context, slots)
                arrays = activations(encoder, token_ids, meta, columns, slots)
                if writing is not None:
                    _written(*writing, bar, task)
                writing = (
                    writer.submit(write_shard, path, shard_name(k, n_shards), schema, arrays, token_ids),
                    len(slots),
                )
            if writing is not None:
                _written(*writing, bar, task)
    return len(todo)


def _written(future: Future, n_contexts: int, bar: Any, task: Any) -> None:
    future.result()  # a failed write (a full disk) raises here; its temp file is gone already
    if bar is not None and task is not None:
        bar.advance(task, n_contexts)


def finish_cache(path: Path, meta: dict) -> bool:
    """Step 5, once every shard is there: the index files, then the record with the CRC-32 of
    every shard (from the files written beside them; a shard written before checksums existed gets
    it from its bytes now) and of the index files. Whether the cache is complete."""
    n_shards = meta["n_shards"]
    if not all((path / shard_name(k, n_shards)).exists() for k in range(n_shards)):
        return False
    stored = read_meta(path) or meta
    if "shard_crc32" in stored and "index_crc32" in stored:
        return True
    crcs = [
        crc if crc is not None else f"{file_crc32(path / shard_name(k, n_shards)):08x}"
        for k, crc in enumerate(shard_crcs(path, {**meta, **stored}))
    ]
    columns = {name: int(meta["d_model"]) for name in meta["columns"]}
    write_dataset_index(
        path, features(columns, meta["context"], meta["dtype"]), n_shards, meta["contexts_sha256"]
    )
    index = {name: f"{file_crc32(path / name):08x}" for name in (INFO, STATE)}
    write_json(path / META, {**meta, "shard_crc32": crcs, "index_crc32": index}, seal=True)
    for k in range(n_shards):  # the record holds them now
        (path / checksum_name(shard_name(k, n_shards))).unlink(missing_ok=True)
    return True
