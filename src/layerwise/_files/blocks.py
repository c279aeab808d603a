"""The three output files, each fed block by block, with memory bounded by one block.

A writer is told each block's texts and ids in input order (:meth:`begin`), then receives the
block's results in any order (:meth:`put`: extraction runs longest first), then :meth:`end_block`;
:meth:`finish` writes what comes last and returns the counts. Layouts: writers.py (.npz, .jsonl)
and parquet.py (.parquet).
"""

from __future__ import annotations

import array
import io
import json
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from .._inputs.corpus import Block
from .._results import LayerStack, SentenceVector, WordVectors, check_float16, result_values

Result = LayerStack | WordVectors | SentenceVector


@dataclass(frozen=True)
class Contents:
    """What a file will hold, known before its first row: how many texts, whether they come with
    pairs, the kind of their ids ("int" or "str"), and whether the texts are kept (--no-text)."""

    n_texts: int
    has_pairs: bool = False
    id_kind: str = "int"
    keep_text: bool = True


class Writer:
    """Counts and flags shared by every format; the formats write."""

    def __init__(self, target: Path | IO[bytes], meta: dict, dtype: str, contents: Contents) -> None:
        self.target, self.meta, self.dtype, self.contents = target, meta, dtype, contents
        n_texts = self.n_texts = contents.n_texts
        self.has_pairs, self.id_kind = contents.has_pairs, contents.id_kind
        self.keep_text = contents.keep_text
        self.truncated = np.zeros(n_texts, dtype=bool)
        self.n_seen = self.n_tokens = self.n_words = self.n_empty = 0
        self.block: Block | None = None
        self.block_seen = 0

    def begin(self, block: Block) -> None:
        self.block, self.block_seen = block, 0

    def put(self, index: int, result: Result, n_tokens: int, empty: bool = False) -> None:
        """``empty``: the input has no token but special ones (``LayerStack.empty``)."""
        if self.dtype == "float16":  # every format's rows pass here: none holds inf for a large value
            check_float16(result_values(result), f"input {index}", self._layers_along(result))
        self.n_seen += 1
        self.n_empty += empty
        self.block_seen += 1
        self.n_tokens += n_tokens
        if isinstance(result, WordVectors):
            self.truncated[index] = result.words_lost > 0
            self.n_words += result.n_words
        else:
            self.truncated[index] = result.truncated

    def _layers_along(self, result: Result) -> tuple[int, ...]:
        """The hidden states along the first axis of ``result``'s numbers (none when fused)."""
        if isinstance(result, LayerStack):
            return result.layers
        if isinstance(result, WordVectors):
            return () if result.fuse else result.layers
        return () if self.meta.get("fuse") else tuple(self.meta.get("layers") or ())

    def end_block(self) -> None:
        if self.block is not None and self.block_seen != len(self.block):
            raise RuntimeError(f"expected {len(self.block)} results, got {self.block_seen}")

    def summary(self) -> dict:
        if self.n_seen != self.n_texts:
            raise RuntimeError(f"expected {self.n_texts} results, got {self.n_seen}")
        return {
            "n_texts": self.n_texts,
            "n_tokens": self.n_tokens,
            "n_words": self.n_words,
            "n_truncated": int(self.truncated.sum()),
            "n_empty": self.n_empty,
        }

    def finish(self) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the writer holds (after an error too)."""


class TextSpool:
    """Texts appended in order, kept as UTF-8 bytes in a temporary file (or in memory for a small
    in-memory target) with their offsets: the .npz's ``texts_utf8`` / ``texts_offsets``."""

    def __init__(self, in_memory: bool) -> None:
        self.file: IO[bytes] = io.BytesIO() if in_memory else tempfile.TemporaryFile()  # noqa: SIM115
        self.offsets = array.array("q", [0])

    def extend(self, texts: list[str]) -> None:
        for text in texts:
            data = text.encode("utf-8", "surrogatepass")
            self.file.write(data)
            self.offsets.append(self.offsets[-1] + len(data))

    def put(self, zf: zipfile.ZipFile, name: str) -> None:
        self.file.seek(0)
        n_bytes = self.offsets[-1]
        with zf.open(f"{name}_utf8.npy", "w", force_zip64=True) as handle:
            header = {"descr": "|u1", "fortran_order": False, "shape": (n_bytes,)}
            np.lib.format.write_array_header_2_0(handle, header)
            _copy(self.file, handle, n_bytes)
        put_array(zf, f"{name}_offsets", np.frombuffer(self.offsets, dtype=np.int64))

    def close(self) -> None:
        self.file.close()


class RowSpool:
    """Fixed-size rows written by index in any order (sentence vectors), in a temporary file for a
    file target: memory stays one row, the page cache holds the rest."""

    def __init__(self, n_rows: int, in_memory: bool) -> None:
        self.n_rows, self.in_memory = n_rows, in_memory
        self.array: np.ndarray | None = None
        self.file: IO[bytes] | None = None
        self.shape: tuple[int, ...] = ()
        self.dtype = np.dtype("float32")

    def put(self, index: int, row: np.ndarray, dtype: str) -> None:
        if self.array is None and self.file is None:
            self.shape, self.dtype = row.shape, np.dtype(dtype)
            if self.in_memory:
                self.array = np.zeros((self.n_rows, *row.shape), dtype=dtype)
            else:
                self.file = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
                self.file.truncate(self.n_rows * self._row_bytes)  # unwritten rows read as zeros
        if self.array is not None:
            self.array[index] = row
            return
        assert self.file is not None
        self.file.seek(index * self._row_bytes)
        self.file.write(np.ascontiguousarray(row, dtype=self.dtype).tobytes())

    @property
    def _row_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def empty(self) -> bool:
        return self.array is None and self.file is None

    def write_npy(self, zf: zipfile.ZipFile, name: str) -> None:
        if self.array is not None:
            put_array(zf, name, self.array)
            return
        assert self.file is not None
        header = {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "fortran_order": False,
            "shape": (self.n_rows, *self.shape),
        }
        self.file.seek(0)
        with zf.open(f"{name}.npy", "w", force_zip64=True) as handle:
            np.lib.format.write_array_header_2_0(handle, header)
            _copy(self.file, handle, self.n_rows * self._row_bytes)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def put_array(zf: zipfile.ZipFile, name: str, values: np.ndarray) -> None:
    with zf.open(f"{name}.npy", "w", force_zip64=True) as handle:
        np.lib.format.write_array(handle, np.asanyarray(values), allow_pickle=False)


def _copy(src: IO[bytes], dst: IO[bytes], n_bytes: int) -> None:
    while n_bytes > 0:
        piece = src.read(min(n_bytes, 1 << 20))
        if not piece:
            raise OSError("a temporary file ended early")
        dst.write(piece)
        n_bytes -= len(piece)


class NpzWriter(Writer):
    """The .npz layout (writers.py). Token- and word-level arrays go into the archive as they come;
    sentence vectors, texts and ids are spooled and written at the end."""

    def __init__(self, target, meta, dtype, contents: Contents) -> None:
        super().__init__(target, meta, dtype, contents)
        small = not isinstance(target, Path)  # an HTTP response body: in memory
        self.zf = zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED, allowZip64=True)
        self.texts, self.pairs = TextSpool(small), TextSpool(small) if self.has_pairs else None
        self.str_ids = TextSpool(small) if self.id_kind == "str" else None
        self.int_ids = array.array("q")
        self.sentences = RowSpool(self.n_texts, small)

    def begin(self, block: Block) -> None:
        super().begin(block)
        if self.keep_text:  # --no-text: no texts_utf8 / text_pairs_utf8 in the archive at all
            self.texts.extend(block.texts)
            if self.pairs is not None:
                self.pairs.extend(block.text_pairs or [""] * len(block))
        if self.str_ids is not None:
            self.str_ids.extend([str(i) for i in block.ids])
        else:
            self.int_ids.extend(block.ids)

    def put(self, index: int, result: Result, n_tokens: int, empty: bool = False) -> None:
        super().put(index, result, n_tokens, empty)
        zf, dtype = self.zf, self.dtype
        if isinstance(result, LayerStack):
            put_array(zf, f"hidden_{index}", result.hidden.astype(dtype, copy=False))
            put_array(zf, f"tokens_{index}", np.asarray(result.tokens, dtype=str))
            put_array(zf, f"offsets_{index}", result.offsets)
            put_array(zf, f"word_ids_{index}", result.word_ids)
            put_array(zf, f"segment_ids_{index}", result.segment_ids)
        elif isinstance(result, WordVectors):
            put_array(zf, f"word_vectors_{index}", result.vectors.astype(dtype, copy=False))
            put_array(zf, f"words_{index}", np.asarray(result.words, dtype=str))
            put_array(zf, f"word_spans_{index}", result.spans)
            put_array(zf, f"word_segment_ids_{index}", result.segment_ids)
        else:
            self.sentences.put(index, result.vector, dtype)

    def finish(self) -> dict:
        summary = self.summary()
        zf = self.zf
        if not self.sentences.empty:
            self.sentences.write_npy(zf, "embeddings")
        put_array(zf, "layers", np.asarray(self.meta.get("layers", ()), dtype=np.int32))
        if self.keep_text:
            self.texts.put(zf, "texts")
            if self.pairs is not None:
                self.pairs.put(zf, "text_pairs")
        if self.str_ids is not None:
            self.str_ids.put(zf, "ids")
        else:
            put_array(zf, "ids", np.frombuffer(self.int_ids, dtype=np.int64))
        put_array(zf, "truncated", self.truncated)
        meta = {**self.meta, "format": "layerwise-npz", "format_version": 3, "dtype": self.dtype}
        put_array(zf, "meta", np.asarray(json.dumps({**meta, "n_texts": self.n_texts})))
        self.zf.close()
        return summary

    def close(self) -> None:
        self.zf.close()
        for spool in (self.texts, self.pairs, self.str_ids, self.sentences):
            if spool is not None:
                spool.close()


class JsonlWriter(Writer):
    """One object per input in input order: a block's records are spooled as they come (longest
    first), then copied out in order when the block ends."""

    def __init__(self, target, meta, dtype, contents: Contents) -> None:
        super().__init__(target, meta, dtype, contents)
        assert isinstance(target, Path)  # .jsonl is written to a file only
        # both closed by close(), which every caller reaches (writers.write_output)
        self.out = open(target, "wb")  # noqa: SIM115
        self.spool = tempfile.TemporaryFile(dir=target.parent)  # noqa: SIM115
        self.spans: dict[int, tuple[int, int]] = {}

    def begin(self, block: Block) -> None:
        super().begin(block)
        self.spool.seek(0)
        self.spool.truncate()
        self.spans = {}

    def put(self, index: int, result: Result, n_tokens: int, empty: bool = False) -> None:
        super().put(index, result, n_tokens, empty)
        # allow_nan=False: bare NaN is not JSON; _vectors has turned non-finite values into null
        record = self._record(index, result)
        line = (json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        self.spans[index] = (self.spool.tell(), len(line))
        self.spool.write(line)

    def end_block(self) -> None:
        super().end_block()
        assert self.block is not None
        for index in range(self.block.start, self.block.start + len(self.block)):
            start, length = self.spans[index]
            self.spool.seek(start)
            self.out.write(self.spool.read(length))
        self.spool.seek(0, io.SEEK_END)

    def finish(self) -> dict:
        summary = self.summary()
        self.close()
        return summary

    def close(self) -> None:
        self.out.close()
        self.spool.close()

    def _vectors(self, values: np.ndarray) -> list:
        # float32 -> Python float is exact, so reading the numbers back gives the same float32.
        values = values.astype(self.dtype, copy=False)
        finite = np.isfinite(values)
        if finite.all():
            return values.tolist()
        as_objects = values.astype(object)
        as_objects[~finite] = None  # NaN/inf are not JSON: null (as pandas writes them)
        return as_objects.tolist()

    def _record(self, index: int, result: Result) -> dict:
        block = self.block
        assert block is not None
        local = index - block.start
        record: dict = {"id": block.ids[local], "model": self.meta.get("model")}
        if index == 0:  # the first line says how the file was made (lw.read_meta reads it)
            record["layerwise"] = {**self.meta, "format": "layerwise-jsonl", "n_texts": self.n_texts}
        if self.keep_text:
            record["text"] = block.texts[local]
            if block.text_pairs is not None:
                record["text_pair"] = block.text_pairs[local]
        record["layers"] = list(self.meta.get("layers", ()))
        if isinstance(result, LayerStack):
            if result.words is not None:
                record["words"] = list(result.words)
            record.update(
                tokens=list(result.tokens),
                offsets=result.offsets.tolist(),
                word_ids=result.word_ids.tolist(),
                segment_ids=result.segment_ids.tolist(),
                truncated=result.truncated,
                hidden=self._vectors(result.hidden),
            )
        elif isinstance(result, WordVectors):
            record.update(
                words=list(result.words),
                word_spans=result.spans.tolist(),
                word_segment_ids=result.segment_ids.tolist(),
                words_lost=result.words_lost,
                word_vectors=self._vectors(result.vectors),
            )
        else:
            record.update(truncated=result.truncated, embedding=self._vectors(result.vector))
        return record
