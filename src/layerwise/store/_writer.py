"""Writing a layerwise store: streaming, resumable, crash-safe.

The input is cut into blocks of ``block_size`` texts in input order. Each block is extracted like
``Encoder.iter_extract`` does (sorted by length, token-budget batches) and its results are appended
row by row to an in-memory buffer. Whole shards (``chunk_rows * shard_chunks`` rows) are written
as soon as they fill, by a background thread so that disk writes overlap compute; after the rows,
the thread writes a manifest part for the texts they complete, then extends the offsets array:
the commit marker. The order of the work is a pure function of the input and the settings, so a
run that is killed and started again recomputes the block it was in and skips the texts already
committed, writing byte-for-byte what an uninterrupted run writes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .._features.plan import OutputPlan
from .._host.memory import release_free_memory
from .._host.progress import progress_bar
from .._inputs.ahead import ahead
from .._inputs.windows import check_window_options
from .._results import LayerStack, SentenceVector, WordVectors, check_float16, layers_along, result_values
from ..errors import OptionError, StoreError
from ._commit import Committer, ShardBuffer, clean_stale, disk_error
from ._format import (
    ATTRIBUTE,
    DATA,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    OFFSETS,
    OFFSETS_CHUNK,
    StoreLayout,
    read_store_meta,
    remove_store_entries,
    sealed,
)
from ._index import create_positions, renew_positions
from ._parts import committed_prefix, open_root, read_manifest
from ._resume import check_inputs, resume_keys, text_sha1
from ._rows import stored_rows
from ._verify import check_structure, rows_checksum

if TYPE_CHECKING:
    from .._encoder import Encoder
    from .._inputs.corpus import Block, Corpus

logger = logging.getLogger("layerwise")


@dataclass(frozen=True)
class StoreSummary:
    path: Path
    n_texts: int
    n_already_committed: int
    n_written: int
    n_rows: int
    n_truncated: int
    seconds: float

    @property
    def resumed(self) -> bool:
        return self.n_already_committed > 0


def _disk_error(path: Path, exc: OSError, committed: int, total: int) -> StoreError:
    return disk_error("store", path, exc, f"{committed} of {total} texts are committed and readable")


class StoreWriter:
    """Extract ``texts`` into the store at ``path``; see :func:`extract_to_store`.

    Every setting is checked here, before the store is created or touched."""

    def __init__(
        self,
        encoder: Encoder,
        path: Path,
        corpus: Corpus,
        plan: OutputPlan,
        *,
        layout: StoreLayout,
        source: str | None,
        shard: dict | None = None,
    ) -> None:
        plan = encoder.settle(plan)  # its final norm decided: what the store records and resumes by
        self.encoder, self.path, self.plan = encoder, path, plan
        self.shard = shard
        self.corpus, self.n_texts = corpus, len(corpus)  # a file corpus is read once: rows checked, counted
        self.level, self.mode = plan.level, plan.mode
        check_window_options(plan.long_texts, plan.stride, encoder.max_length)
        if not isinstance(layout, StoreLayout):
            raise OptionError(f"layout must be a layerwise.StoreLayout, not {type(layout).__name__}")
        self.fuse, self.special_tokens = plan.fuse, plan.special_tokens
        self.dtype, self.block_size = plan.dtype, layout.block_size
        self.chunk_rows, self.shard_rows = layout.chunk_rows, layout.chunk_rows * layout.shard_chunks
        layout.check_cost(int(np.prod(self._row_shape())) * np.dtype(self.dtype).itemsize)
        self.source = source
        self.meta = self._meta()

    # ------------------------------------------------------------------ layout
    def _row_shape(self) -> tuple[int, ...]:
        return self.plan.row_shape(self.encoder.hidden_size, self.encoder.n_hidden_states)

    def _meta(self) -> dict:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            **self.encoder.run_meta(self.plan),  # the settings, the weights' hash, the plan, the version
            "row_shape": list(self._row_shape()),
            "n_texts": self.n_texts,
            "pairs": self.corpus.has_pairs,
            "block_size": self.block_size,
            "chunk_rows": self.chunk_rows,
            "shard_chunks": self.shard_rows // self.chunk_rows,
            "source": self.source,
            "corpus": self.corpus.reading,  # how the source was read: format, columns, limit, …
            # a shard of a sharded store records which one it is (shard_table.shard_identity)
            **({"shard": self.shard} if self.shard is not None else {}),
        }

    def _open(self):
        """Open the store to resume it, or create it. Called with the writer lock held."""

        stored = read_store_meta(self.path)
        if stored is None:
            return self._create()
        group = open_root(self.path, "r+")
        try:
            n_committed, _ = committed_prefix(group[OFFSETS], stored)
        except KeyError:  # a crash while the store was being created
            n_committed = 0
        if n_committed <= 0:
            # nothing committed: start it again, with these settings. A writer killed inside
            # _create leaves any prefix of its steps (the data array without the manifest folder:
            # tests/test_store_integrity.py), and there is nothing to keep.
            remove_store_entries(self.path)
            return self._create()
        different = [k for k in resume_keys() if stored.get(k) != self.meta.get(k)]
        if different:
            details = "; ".join(f"{k}: stored {stored.get(k)!r}, now {self.meta.get(k)!r}" for k in different)
            raise StoreError(
                f"store {str(self.path)!r} was written with other settings ({details}); write to a new "
                "path, or pass --overwrite (Python: overwrite=True) to start it again"
            )
        return group

    def _create(self):
        import zarr

        # the metadata goes in with the group: from its first byte the folder says it is a store
        group = zarr.create_group(str(self.path), zarr_format=3, attributes={ATTRIBUTE: sealed(self.meta)})
        shape = self._row_shape()
        group.create_array(
            DATA,
            shape=(0, *shape),
            chunks=(self.chunk_rows, *shape),
            shards=(self.shard_rows, *shape),
            dtype=self.dtype,
            fill_value=0,
            compressors=None,  # float16 activations barely compress; compression would cost compute
            config={"write_empty_chunks": True},  # every committed shard is a file: a missing one is damage
        )
        marker = group.create_array(
            OFFSETS, shape=(1,), chunks=(OFFSETS_CHUNK,), dtype="int64", fill_value=-1
        )
        marker[0:1] = np.zeros(1, dtype=np.int64)
        create_positions(group, self.n_texts)
        (self.path / MANIFEST).mkdir(exist_ok=True)
        return group

    # ------------------------------------------------------------------ results to rows
    def _rows_and_record(
        self, text_id: int, stack: LayerStack, result: LayerStack | WordVectors | SentenceVector, block: Block
    ) -> tuple[np.ndarray, dict]:
        local = text_id - block.start
        text = block.texts[local]
        pair = block.text_pairs[local] if block.text_pairs is not None else None
        record: dict = {
            "text_id": text_id,
            "id": block.ids[local],  # the input's own id (--id-column), else its 0-based row
            "text": text,
            "text_pair": pair,
            "text_sha1": text_sha1(text, pair),
            "truncated": bool(stack.truncated),
            "n_windows": int(stack.n_windows),
        }
        if isinstance(result, LayerStack):
            rows = result.hidden.transpose(1, 0, 2)  # token-major rows
            record.update(
                tokens=list(result.tokens),
                char_start=result.offsets[:, 0].tolist(),
                char_end=result.offsets[:, 1].tolist(),
                word_ids=result.word_ids.tolist(),
                segment_ids=result.segment_ids.tolist(),
            )
        elif isinstance(result, WordVectors):
            rows = result.vectors if self.fuse is not None else result.vectors.transpose(1, 0, 2)
            record.update(
                words=list(result.words),
                char_start=result.spans[:, 0].tolist(),
                char_end=result.spans[:, 1].tolist(),
                segment_ids=result.segment_ids.tolist(),
                n_subwords=result.n_subwords.tolist(),
                words_lost=int(result.words_lost),
            )
        else:
            rows = result.vector[None]
        rows = stored_rows(rows, self.dtype)
        record["crc32"] = rows_checksum(rows)
        return rows, record

    # ------------------------------------------------------------------ the run
    def _results(self, block: Block):
        """The block's results: tokenised now (on _inputs/ahead.py's thread), computed as they are read."""
        texts = block.texts if block.words is None else None
        return self.encoder.iter_results(  # truncation is reported once, with corpus-wide numbers
            self.plan,
            texts,
            text_pairs=block.text_pairs,
            words=block.words,
            progress=False,
            report_truncation=False,
        )

    def run(self, progress: bool | None) -> StoreSummary:
        summary = self._run(progress)
        if summary.n_truncated:
            logger.warning(
                "%d of %d texts were longer than %d tokens and were truncated; the manifest's 'truncated' "
                "column marks them. Pass long_texts='window' to keep every token.",
                summary.n_truncated,
                summary.n_written,
                self.encoder.max_length,
            )
        return summary

    def _run(self, progress: bool | None) -> StoreSummary:
        started = time.perf_counter()
        group = self._open()
        n_committed, committed_end = committed_prefix(group[OFFSETS], self.meta)
        clean_stale(self.path, n_committed)
        check_structure(self.path)  # never resume onto damage
        manifest = read_manifest(self.path, n_committed, ("text_id", "text_sha1"))
        committed_ids = manifest["text_id"].to_pylist() if manifest is not None else []
        check_inputs(self.path, manifest, self.corpus)
        renew_positions(group, self.n_texts, manifest)
        if n_committed == self.n_texts:
            return StoreSummary(self.path, self.n_texts, n_committed, 0, committed_end, 0, 0.0)

        done = set(committed_ids)
        first_block = min(i for i in range(self.n_texts) if i not in done) // self.block_size
        buffer_start = (committed_end // self.shard_rows) * self.shard_rows
        buffer = ShardBuffer(
            self.shard_rows, self.dtype, start=buffer_start, position=n_committed, end=committed_end
        )
        if buffer_start < committed_end:
            # committed rows that share the last, partly committed shard are rewritten with it
            kept = np.asarray(group[DATA][buffer_start:committed_end])
            buffer.rows.append(kept)
            buffer.n_buffered = len(kept)
        committer = Committer(group, self.path)
        committer.start()
        written = truncated = 0
        bar = progress_bar("storing", "texts", progress)
        try:
            with bar if bar is not None else contextlib.nullcontext():
                task = bar.add_task("store", total=self.n_texts, completed=n_committed) if bar else None
                blocks = self.corpus.blocks(self.block_size, start=first_block * self.block_size)
                for block, outputs in ahead(blocks, self._results):  # the next block tokenised meanwhile
                    for local, stack, result in outputs:
                        text_id = block.start + local
                        if text_id in done:
                            continue  # committed before an interruption; recomputed only to replay batches
                        if self.dtype == "float16":  # inf would be stored for a value past its range
                            check_float16(
                                result_values(result), f"input {text_id}", layers_along(stack, self.fuse)
                            )
                        rows, record = self._rows_and_record(text_id, stack, result, block)
                        committer.submit(buffer.append(rows, record))
                        written, truncated = written + 1, truncated + stack.truncated
                        release_free_memory()  # RSS follows the batch, not the corpus (memory.py)
                        if bar is not None:
                            bar.advance(task, 1)
                committer.submit(buffer.flush(final=True))
                committer.close()
            data = group[DATA]
            if data.shape[0] != buffer.end:
                data.resize((buffer.end, *data.shape[1:]))  # drop rows a crash left past the commit
        except OSError as exc:
            with contextlib.suppress(BaseException):
                committer.close()
            if isinstance(exc, StoreError):
                raise
            committed, _ = committed_prefix(group[OFFSETS], self.meta)
            with contextlib.suppress(OSError):  # what the failed writes left (zarr's temp files too)
                clean_stale(self.path, committed)
            raise _disk_error(self.path, exc, committed, self.n_texts) from exc
        except BaseException:
            with contextlib.suppress(BaseException):
                committer.close()
            raise
        return StoreSummary(
            self.path,
            self.n_texts,
            n_committed,
            written,
            buffer.end,
            truncated,
            time.perf_counter() - started,
        )
