"""``extract_to_store``: a corpus into a store, resumably. Every argument and text is checked
before anything exists; the folder is written into under its lock; a run refused before its first
commit removes what it made (the store's entries, and the folder when it made it)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from .._features.plan import OutputPlan
from .._model.loading.weights_hash import weights_sha256
from ..errors import LayerwiseError, OptionError, StoreError
from ._format import (
    StoreLayout,
    classify,
    not_a_store,
    remove_store_entries,
    require_store_dependencies,
)
from ._lock import remove_lock_if_alone, writer_lock
from ._writer import StoreSummary, StoreWriter

if TYPE_CHECKING:
    from .._encoder import Encoder
    from .._inputs.corpus import Corpus


def extract_to_store(
    encoder: Encoder,
    corpus: Corpus | Iterable[str] | str | os.PathLike,
    path: str | os.PathLike,
    plan: OutputPlan | None = None,
    *,
    layout: StoreLayout | None = None,
    overwrite: bool = False,
    source: str | None = None,
    shard: dict | None = None,
    progress: bool | None = None,
) -> StoreSummary:
    """Extract ``corpus`` into a store at ``path`` (a folder, conventionally ``*.lw``).

    ``corpus`` is a :class:`~layerwise.Corpus` (files and their columns: ``lw.Corpus("t.csv",
    text_column="body")``; texts in memory with pairs or ids: ``lw.Corpus.from_inputs(texts,
    text_pairs=…, ids=…)``), a list of texts, or a path read with the default columns; the
    manifest keeps each text's ``id``. What is stored is an :class:`OutputPlan` (default: every
    layer of every token, float16): ``OutputPlan.parse(pool="sentence:mean", long_texts="window")``;
    ``layout`` a :class:`StoreLayout` (block size, chunk rows, shard chunks). The store's metadata
    records the plan and the Encoder's settings (``lw.read_meta``). Running the same call again after
    an interruption resumes where the last commit left off (a different plan, model or final norm is
    refused, naming it); a finished store is left as it is. Every argument and every text is checked
    before anything is created; only an empty folder or a layerwise store is written into, and
    ``overwrite`` removes only the store's own entries. ``shard`` is the identity a shard of a
    sharded store records (set by _shard_writer.py)."""
    # the weights' hash for the metadata (remembered on the model) while zarr and pyarrow import:
    # hashlib lets go of the GIL, so on a fresh process this hides most of its 0.06 s
    hashing = threading.Thread(target=weights_sha256, args=(encoder.models.current,), name="layerwise-hash")
    hashing.start()
    try:
        require_store_dependencies()
    finally:
        hashing.join()
    from .._inputs.corpus import as_corpus

    plan = OutputPlan(dtype="float16") if plan is None else plan
    if not isinstance(plan, OutputPlan):
        raise OptionError(f"plan must be a layerwise.OutputPlan, not {type(plan).__name__}")
    path = Path(path)
    writer = StoreWriter(  # reads the corpus once: bad input fails before anything exists
        encoder, path, as_corpus(corpus), plan, layout=layout or StoreLayout(), source=source, shard=shard
    )
    if classify(path) == "other":
        from ._shard_table import TABLE, is_sharded

        if is_sharded(path):
            raise StoreError(
                f"{str(path)!r} is a sharded store (its {TABLE}: written on Ray); resume or overwrite it "
                "on Ray (--ray local, lw.ray.extract_to_store), or write this store to a new path"
            )
        raise not_a_store(path)
    made_folder = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"cannot create store {str(path)!r}: {exc.strerror}; choose a writable path"
        ) from exc
    with writer_lock(path):
        kind = classify(path)  # again, now that no other writer can change it
        if kind == "other":
            raise not_a_store(path)
        if overwrite and kind == "store":
            remove_store_entries(path)
        try:
            return writer.run(progress)
        except LayerwiseError:  # refused (bad input, an overflow): what this run made, it removes
            if kind != "store" or overwrite:
                _remove_if_nothing_committed(path)
                remove_lock_if_alone(path, made_folder)  # while held: a waiting writer takes a new one
            raise


def _remove_if_nothing_committed(path: Path) -> None:
    """A store this run began and a refusal stopped before its first commit: its entries removed
    (a store with committed texts stays, for the same call to resume)."""
    from ._parts import open_parts

    try:
        committed = open_parts(path).n_committed if classify(path) == "store" else 0
    except LayerwiseError:
        committed = 0  # begun and not even readable: nothing of it is worth keeping
    if committed == 0:
        remove_store_entries(path)
