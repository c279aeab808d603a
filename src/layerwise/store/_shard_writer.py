"""Writing a sharded store: the table first, then each shard with the ordinary store writer.

:func:`begin_sharded_store` decides, before any shard is touched, whether ``path`` is a new store, a
store to resume (same texts and settings: its table, and so its run id, is kept) or one to start
again (``overwrite``: only this store's own shards and table are deleted, found by looking, not by
trusting the table). :func:`write_shard` writes shard ``k`` of a table with its identity recorded in
its own metadata. ``lw.ray`` runs ``write_shard`` in its actors; without Ray, a loop over the shards
writes the same store.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import OptionError
from ._resume import resume_keys
from ._shard_table import (
    TABLE,
    is_sharded,
    new_table,
    read_table,
    remove_own_shards,
    shard_identity,
    shard_path,
    texts_sha256,
    write_table,
)

if TYPE_CHECKING:
    from .._encoder import Encoder
    from .._features.plan import OutputPlan
    from .._inputs.corpus import Corpus
    from .._settings.settings import Settings
    from ._format import StoreLayout
    from ._writer import StoreSummary

# The table's entries a resumed run must find unchanged: the model (by name), what changes the
# numbers (settings.NUMBERS) and the layout; not the run id and the shards' names, which follow.
_SAME_TO_RESUME = resume_keys(
    "model", ("n_texts", "shard_size", "texts_sha256", "block_size", "chunk_rows", "shard_chunks")
)


_RECORDED_SINCE_0_3 = {"final_norm", "model_dtype", "max_length", "block_size", "chunk_rows", "shard_chunks"}


def begin_sharded_store(
    path: str | os.PathLike,
    *,
    model: str,
    plan: OutputPlan,
    n_hidden_states: int,
    texts: Sequence[str] | Corpus,
    text_pairs: Sequence[str] | None,
    shard_size: int | None,
    overwrite: bool,
    settings: Settings | None = None,
    layout: dict | None = None,
    auto_shard_size: int = 1024,
    run: dict | None = None,
) -> dict:
    """The table to write ``texts`` (a list, or a Corpus read once to plan the shards) into
    ``path`` with, written there; see the module docstring. ``plan`` is settled (its final norm
    decided); ``settings`` and ``layout`` (block_size, chunk_rows, shard_chunks) are recorded in
    the table. ``shard_size`` None: the existing table's when resuming, else ``auto_shard_size``."""
    from .._inputs.corpus import Corpus

    path = Path(path)
    if shard_size is None:
        resumable = is_sharded(path) and not overwrite
        shard_size = read_table(path).get("shard_size", auto_shard_size) if resumable else auto_shard_size
    corpus = texts if isinstance(texts, Corpus) else Corpus.from_inputs(texts, text_pairs=text_pairs)
    # the settings as given (max_length None: the model's; the shards record what it resolved to);
    # the final norm is the settled plan's
    given = settings.as_dict() if settings is not None else {}
    recorded = {k: v for k, v in given.items() if k not in ("model", "final_norm")}
    table = new_table(
        model=model,
        plan_meta=plan.meta(n_hidden_states),
        corpus=corpus,
        shard_size=shard_size,
        settings={**recorded, **(layout or {}), **(run or {}), "corpus": corpus.reading},
    )
    if is_sharded(path) and overwrite:
        remove_own_shards(path)
    elif is_sharded(path):
        old = read_table(path)
        # a table of layerwise 0.2 did not record the settings and the layout: those are not compared
        differing = [
            key
            for key in _SAME_TO_RESUME
            if old.get(key) != table.get(key) and (key in old or key not in _RECORDED_SINCE_0_3)
        ]
        if differing:
            raise OptionError(
                f"{path} was written with other settings or texts ({', '.join(differing)}); pass the same "
                "ones to resume, or overwrite=True (--overwrite) to start again"
            )
        return old  # a resumed run keeps its table, and so its run id: its shards belong to it
    elif path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise OptionError(
            f"{path} exists and is not a sharded layerwise store ({TABLE} missing); choose a new folder"
        )
    write_table(path, table)
    return table


def write_shard(
    encoder: Encoder,
    root: str | os.PathLike,
    table: dict,
    index: int,
    texts: Sequence[str],
    text_pairs: Sequence[str] | None,
    plan: OutputPlan,
    *,
    ids: Sequence | None = None,
    progress: bool | None = False,
    layout: StoreLayout | None = None,
) -> StoreSummary:
    """Write (or resume) shard ``index`` of ``table``: ``texts`` are its range's texts (``ids``
    their ids, kept in the shard's manifest; None: their global 0-based rows, as a store of the
    whole corpus keeps them); ``layout``: the store's (its defaults where None)."""
    from .._inputs.corpus import Corpus
    from ._extract_to_store import extract_to_store

    shard = table["shards"][index]
    if texts_sha256(texts, text_pairs) != shard["texts_sha256"]:
        raise OptionError(
            f"these {len(texts)} texts are not the texts of shard {index} (texts {shard['start']}.."
            f"{shard['stop'] - 1} of the table); pass texts[start:stop] of the corpus the table was made for"
        )
    if ids is None:  # the shard's texts are rows start.. of the corpus: their ids say so
        ids = list(range(shard["start"], shard["stop"]))
    return extract_to_store(
        encoder,
        Corpus.from_inputs(texts, text_pairs=text_pairs, ids=ids),
        shard_path(Path(root), shard["name"]),
        plan,
        shard=shard_identity(table, index),
        progress=progress,
        layout=layout,
    )
