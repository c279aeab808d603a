"""A store's token rows, pooled and fused into the file outputs, without the model.

    layerwise export corpus.lw -o vectors.parquet --pool sentence:mean --layers -1
    lw.export_store("corpus.lw", "vectors.parquet", lw.OutputPlan.parse(pool="sentence:mean", layers=-1))

A token-level store keeps every token's rows with its tokens, offsets, word ids and segment ids:
everything pooling needs. Export reads it a block of texts at a time (one read of their rows),
applies the plan and writes .parquet, .npz or .jsonl in input order with the ids the store kept.
The numbers are those of the stored rows: pooling float16 rows gives what float16 inputs give.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from .._features.plan import OutputPlan
from .._results import LayerStack
from .._version import __version__
from ..errors import LayerSpecError, OptionError

BLOCK = 1024  # texts per read


def export_store(
    store: str | os.PathLike | object,
    path: str | os.PathLike,
    plan: OutputPlan | None = None,
    *,
    keep_text: bool = True,
    progress: bool | None = None,
) -> dict:
    """Pool the token rows of ``store`` (a path or an open store) as ``plan`` says (default:
    sentence mean of every stored hidden state) and write them to ``path`` (.parquet, .npz or
    .jsonl). Returns counts: n_texts, n_tokens, n_words, n_truncated, n_empty (texts with no token
    but special ones)."""
    from .blocks import Contents
    from .writers import output_format, write_output, writer_class_of

    plan = plan if plan is not None else OutputPlan(level="sentence", mode="mean")
    path = Path(path)
    if path.suffix.lower() == ".lw":
        raise OptionError(
            f"export writes pooled vectors to a file: {str(path)!r} names a store. Give -o a .parquet, .npz "
            "or .jsonl file; to pool into a store, run extract again with --pool"
        )
    fmt = output_format(path, plan.level)
    opened = _complete_token_store(store)
    n_texts = len(opened)
    id_column = "id" if "id" in opened.manifest_column_names() else "text_id"
    pairs = bool(opened.meta.get("pairs"))
    id_kind = _id_kind(opened, id_column, n_texts)
    wanted, picks = _stored_layers(opened, plan)

    def fill(writer) -> dict:
        from .._host.progress import progress_bar

        bar = progress_bar("exporting", "texts", progress) if progress is not False else None
        with bar if bar is not None else contextlib.nullcontext():
            task = bar.add_task("export", total=n_texts) if bar is not None else None
            for lo in range(0, n_texts, BLOCK):
                hi = min(lo + BLOCK, n_texts)
                _export_block(writer, opened, lo, hi, id_column, pairs, plan, picks, wanted)
                if bar is not None and task is not None:
                    bar.advance(task, hi - lo)
        return writer.finish()

    meta = _exported_meta(opened, plan)
    writer_class, contents = writer_class_of(fmt), Contents(n_texts, pairs, id_kind, keep_text)
    return write_output(path, lambda tmp: writer_class(tmp, meta, plan.dtype, contents), fill)


def _complete_token_store(store: Any) -> Any:
    """The store (a path, opened here, or an open store), refused unless it holds token rows of
    every text: export pools tokens, and a half-written store would export half a corpus."""
    from ..store import open_store

    opened: Any = open_store(store) if isinstance(store, str | os.PathLike) else store
    meta: dict = opened.meta
    if meta.get("level") != "token":
        raise OptionError(
            f"{opened.path} holds {meta.get('level')}-level vectors, already pooled; export pools "
            "token rows: read it with lw.open_store, or extract a token-level store (--pool token)"
        )
    n_texts = int(meta["n_texts"])
    if len(opened) != n_texts:
        raise OptionError(
            f"{opened.path} holds {len(opened)} of {n_texts} texts: finish it first (rerun the "
            "extract command that made it: it resumes)"
        )
    return opened


def _stored_layers(opened: Any, plan: OutputPlan) -> tuple[tuple[int, ...], list[int]]:
    """``(wanted, picks)``: the hidden states the plan needs and where the store keeps each."""
    stored = tuple(opened.meta["layers"])
    wanted = plan.hidden_states(int(opened.meta["n_hidden_states"]))
    missing = [i for i in wanted if i not in stored]
    if missing:
        raise LayerSpecError(
            f"hidden state(s) {missing} are not in {opened.path}: it holds {list(stored)}; choose among "
            "them with --layers"
        )
    return wanted, [stored.index(i) for i in wanted]


def _exported_meta(opened: Any, plan: OutputPlan) -> dict:
    """The file's metadata: how the store's vectors were made (model, settings, final norm, long
    texts) carries over; the pooling is this export's."""

    store_only = {
        "format",
        "format_version",
        "row_shape",
        "n_texts",
        "pairs",
        "block_size",
        "chunk_rows",
        "shard_chunks",
        "shard",
        "source",
        "corpus",
        "n_shards",
        "table",
        "shards",
        "run_id",
    }
    meta_in: dict = opened.meta
    return {
        **{k: v for k, v in meta_in.items() if k not in store_only},
        **plan.meta(int(meta_in["n_hidden_states"])),
        "long_texts": meta_in.get("long_texts"),
        "stride": meta_in.get("stride"),
        "final_norm": meta_in.get("final_norm"),
        "stored_dtype": meta_in.get("dtype"),
        "source": str(opened.path),
        "exported_with": __version__,
    }


def _export_block(
    writer: Any,
    opened: Any,
    lo: int,
    hi: int,
    id_column: str,
    pairs: bool,
    plan: OutputPlan,
    picks: list[int],
    wanted: tuple[int, ...],
) -> None:
    """Texts ``lo`` to ``hi`` of the store, one read of their rows, pooled into ``writer``."""
    from .._inputs.corpus import Block

    n_hidden = int(opened.meta["n_hidden_states"])
    stacks = opened.read_many(list(range(lo, hi)))
    texts = [stack.text for stack in stacks]
    block_pairs = [stack.text_pair or "" for stack in stacks] if pairs else None
    ids = opened.manifest_rows(range(lo, hi), [id_column])[id_column].to_pylist()
    writer.begin(Block(lo, texts, block_pairs, None, ids))
    for k, stack in enumerate(stacks):
        result = plan.result(_layers(stack, picks, wanted), n_hidden)
        writer.put(lo + k, result, stack.n_tokens, stack.empty)
    writer.end_block()


def _id_kind(opened: Any, column: str, n_texts: int) -> str:
    """ "int" when every id is an integer, else "str": from the manifest's column type when the
    store was written at once (one type), else by reading the ids a block at a time."""
    import pyarrow as pa

    kinds = set()
    for lo in range(0, n_texts, BLOCK):
        values = opened.manifest_rows(range(lo, min(lo + BLOCK, n_texts)), [column])[column]
        kinds.add("int" if pa.types.is_integer(values.type) else "str")
        if "str" in kinds:
            return "str"
    return "int"


def _layers(stack: LayerStack, picks: list[int], wanted: tuple[int, ...]) -> LayerStack:
    """``stack`` holding only the hidden states ``wanted`` (at ``picks`` of its own)."""
    if list(picks) == list(range(len(stack.layers))):
        return stack
    hidden = np.ascontiguousarray(stack.hidden[picks])
    return LayerStack(**{**stack.__dict__, "hidden": hidden, "layers": tuple(wanted)})
