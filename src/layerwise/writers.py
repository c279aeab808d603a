"""Write extraction results to .npz or .jsonl, streaming and atomically.

Results arrive in compute order (longest inputs first) and are written as they come, so memory
stays bounded by one batch (sentence vectors, one row per text, are gathered into one array).
Files are written under a temporary name next to the target and renamed at the end: an error or
an interrupt never leaves a half-written file behind.

.npz layout (``numpy.load`` reads it; no pickle)::

    meta                  JSON string: format, version, model, layers, pool, fuse, dtype, n_texts, ...
    layers                (n_layers,) int32: hidden-state indices, 0 = embedding output
    texts_utf8            (total bytes,) uint8: every text's UTF-8 bytes, one after another
    texts_offsets         (n_texts + 1,) int64: text i is texts_utf8[offsets[i]:offsets[i + 1]]
    text_pairs_utf8, text_pairs_offsets   the same for the second segments, when there are pairs
    truncated             (n_texts,) bool

(``read_npz_texts(npz)`` decodes them. Version 1 kept ``texts`` as a fixed-width ``<U`` array, so
one 100,000-character line made every text 400 KB wide.)
  pool = token:
    hidden_{i}            (n_layers, n_tokens_i, hidden)
    tokens_{i}            (n_tokens_i,) str, wordpieces incl. [CLS]/[SEP]
    offsets_{i}           (n_tokens_i, 2) int32 character spans; word_ids_{i}; segment_ids_{i}
  pool = word:MODE:
    word_vectors_{i}      (n_layers, n_words_i, dim), or (n_words_i, dim) with a fusion
    words_{i}             (n_words_i,) str; word_spans_{i} (n_words_i, 2); word_segment_ids_{i}
  pool = sentence:MODE:
    embeddings            (n_texts, n_layers, hidden), or (n_texts, dim) with a fusion

.jsonl: one object per input, in input order, with the same fields (vectors as nested lists).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal

import numpy as np

from .errors import LayerwiseError, OptionError, OutputError, check_choice
from .results import LayerStack, SentenceVector, WordVectors

if TYPE_CHECKING:
    from .encoder import Encoder
    from .plan import OutputPlan

OutputDtype = Literal["float32", "float16"]
FORMATS = (".npz", ".jsonl")
Result = LayerStack | WordVectors | SentenceVector


def output_format(path: str | Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise OptionError(
            f"output {str(path)!r} has an unknown suffix {suffix!r}; use .npz (compact arrays) or .jsonl"
        )
    return suffix


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_temp_files(path: Path) -> None:
    """Temp files of ``path`` left by a process that was killed (SIGKILL cannot be cleaned up after).
    Names are ``.NAME.PID.RANDOM.tmp``; a file whose writer still runs is left alone."""
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):
        parts = leftover.name[len(path.name) + 2 :].split(".")
        pid = int(parts[0]) if len(parts) == 3 and parts[0].isdigit() else None
        if pid is None or (pid != os.getpid() and not _pid_alive(pid)):
            with contextlib.suppress(OSError):
                leftover.unlink()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path next to ``path`` that replaces it only if the block succeeds.

    The file gets the mode a plain ``open()`` would give it (0666 minus the umask), not
    mkstemp's 0600."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise OptionError(f"output folder {str(directory)!r} does not exist; create it first")
    _remove_stale_temp_files(path)
    tmp = directory / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 & ~_umask())
    except OSError as exc:
        raise OptionError(
            f"cannot write to {str(directory)!r}: {exc.strerror}; choose a writable output folder"
        ) from exc
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def extract_to_file(
    encoder: Encoder,
    texts: Sequence[str],
    path: str | os.PathLike,
    plan: OutputPlan | None = None,
    *,
    text_pairs: Sequence[str] | None = None,
    long_texts: str = "truncate",
    stride: int | None = None,
    method: str = "hidden_states",
    source: str | None = None,
    progress: bool | None = None,
) -> dict:
    """Extract ``texts`` as ``plan`` says (default: every layer of every token, float32) and write
    them to ``path`` (.npz or .jsonl), streaming, in input order; nothing is written on error.
    Returns counts: n_texts, n_tokens, n_words, n_truncated."""
    from . import __version__
    from .inputs import as_texts
    from .plan import OutputPlan

    plan = plan if plan is not None else OutputPlan()
    path = Path(path)
    output_format(path)  # before any work
    texts = as_texts(texts)  # any iterable of strings (a pandas Series, a pyarrow array, …)
    text_pairs = as_texts(text_pairs, "text_pairs") if text_pairs is not None else None
    n = encoder.n_hidden_states
    stream = encoder.iter_extract(
        texts, text_pairs=text_pairs, layers=plan.hidden_states(n), method=method,  # type: ignore[arg-type]
        long_texts=long_texts, stride=stride, progress=progress,  # type: ignore[arg-type]
    )  # fmt: skip
    meta = {
        "model": encoder.name,
        **plan.meta(n),
        "long_texts": long_texts,
        "stride": stride,
        "max_length": encoder.max_length,
        "model_dtype": encoder.model_dtype,
        "method": method,
        "source": source,
        "layerwise_version": __version__,
    }
    return write_results(
        path, plan.apply(stream, n_hidden_states=n), texts=texts, text_pairs=text_pairs, meta=meta,
        dtype=plan.dtype,
    )  # fmt: skip


def write_results(
    path: str | Path,
    results: Iterable[tuple[int, Result]],
    *,
    texts: Sequence[str],
    text_pairs: Sequence[str] | None = None,
    meta: dict,
    dtype: OutputDtype = "float32",
) -> dict:
    """Write ``(index, result)`` pairs for ``texts`` to ``path`` (.npz or .jsonl); a result is a
    LayerStack, a WordVectors or a SentenceVector. Returns summary counts."""
    check_choice("dtype", dtype, ("float32", "float16"))
    path = Path(path)
    fmt = output_format(path)
    writer = _NpzWriter if fmt == ".npz" else _JsonlWriter
    try:
        with atomic_path(path) as tmp:
            return writer(tmp, texts, text_pairs, meta, dtype).write(results)
    except OSError as exc:
        if isinstance(exc, LayerwiseError):
            raise
        raise OutputError(
            f"writing {str(path)!r} failed: {exc.strerror or exc}; nothing was written. Free some space "
            "(an .npz of every layer takes hidden x layers x 4 bytes per token) or choose another folder, "
            "then rerun"
        ) from exc


def npz_bytes(
    results: Iterable[tuple[int, Result]],
    *,
    texts: Sequence[str],
    text_pairs: Sequence[str] | None = None,
    meta: dict,
    dtype: OutputDtype = "float32",
) -> bytes:
    """The ``.npz`` layout of :func:`write_results`, in memory (an HTTP response body)."""
    import io

    check_choice("dtype", dtype, ("float32", "float16"))
    buffer = io.BytesIO()
    _NpzWriter(buffer, texts, text_pairs, meta, dtype).write(results)
    return buffer.getvalue()


class _Writer:
    def __init__(
        self,
        tmp: Path | IO[bytes],
        texts: Sequence[str],
        text_pairs: Sequence[str] | None,
        meta: dict,
        dtype: str,
    ) -> None:
        self.tmp, self.texts, self.text_pairs, self.meta, self.dtype = tmp, texts, text_pairs, meta, dtype
        self.n_texts = len(texts)
        self.truncated = np.zeros(self.n_texts, dtype=bool)
        self.seen: set[int] = set()
        self.n_tokens = 0
        self.n_words = 0

    def note(self, index: int, result: Result) -> None:
        self.seen.add(index)
        if isinstance(result, LayerStack):
            self.truncated[index] = result.truncated
            self.n_tokens += result.n_tokens
        elif isinstance(result, WordVectors):
            self.truncated[index] = result.words_lost > 0
            self.n_words += result.n_words
        else:
            self.truncated[index] = result.truncated

    def finish(self) -> dict:
        if len(self.seen) != self.n_texts:
            raise RuntimeError(f"expected {self.n_texts} results, got {len(self.seen)}")
        return {
            "n_texts": self.n_texts,
            "n_tokens": self.n_tokens,
            "n_words": self.n_words,
            "n_truncated": int(self.truncated.sum()),
        }

    def write(self, results: Iterable[tuple[int, Result]]) -> dict:
        raise NotImplementedError


class _NpzWriter(_Writer):
    def write(self, results: Iterable[tuple[int, Result]]) -> dict:
        sentences: np.ndarray | None = None
        with zipfile.ZipFile(self.tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for i, result in results:
                self.note(i, result)
                if isinstance(result, LayerStack):
                    self._put(zf, f"hidden_{i}", result.hidden.astype(self.dtype, copy=False))
                    self._put(zf, f"tokens_{i}", np.asarray(result.tokens, dtype=str))
                    self._put(zf, f"offsets_{i}", result.offsets)
                    self._put(zf, f"word_ids_{i}", result.word_ids)
                    self._put(zf, f"segment_ids_{i}", result.segment_ids)
                elif isinstance(result, WordVectors):
                    self._put(zf, f"word_vectors_{i}", result.vectors.astype(self.dtype, copy=False))
                    self._put(zf, f"words_{i}", np.asarray(result.words, dtype=str))
                    self._put(zf, f"word_spans_{i}", result.spans)
                    self._put(zf, f"word_segment_ids_{i}", result.segment_ids)
                else:
                    if sentences is None:
                        sentences = np.zeros((self.n_texts, *result.vector.shape), dtype=self.dtype)
                    sentences[i] = result.vector
            summary = self.finish()
            if sentences is not None:
                self._put(zf, "embeddings", sentences)
            self._put(zf, "layers", np.asarray(self.meta.get("layers", ()), dtype=np.int32))
            self._put_texts(zf, "texts", self.texts)
            if self.text_pairs is not None:
                self._put_texts(zf, "text_pairs", self.text_pairs)
            self._put(zf, "truncated", self.truncated)
            meta = {
                **self.meta,
                "format": "layerwise-npz",
                "format_version": 2,
                "dtype": self.dtype,
                "n_texts": self.n_texts,
            }
            self._put(zf, "meta", np.asarray(json.dumps(meta)))
        return summary

    def _put_texts(self, zf: zipfile.ZipFile, name: str, texts: Sequence[str]) -> None:
        encoded = [t.encode("utf-8", "surrogatepass") for t in texts]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        self._put(zf, f"{name}_utf8", np.frombuffer(b"".join(encoded), dtype=np.uint8))
        self._put(zf, f"{name}_offsets", offsets)

    @staticmethod
    def _put(zf: zipfile.ZipFile, name: str, array: np.ndarray) -> None:
        with zf.open(f"{name}.npy", "w", force_zip64=True) as handle:
            np.lib.format.write_array(handle, np.asanyarray(array), allow_pickle=False)


class _JsonlWriter(_Writer):
    def write(self, results: Iterable[tuple[int, Result]]) -> dict:
        # Results come longest first; spool them, then copy the lines out in input order.
        spans: dict[int, tuple[int, int]] = {}
        assert isinstance(self.tmp, Path)  # .jsonl is written to a file only
        with tempfile.TemporaryFile(dir=self.tmp.parent) as spool:
            for i, result in results:
                self.note(i, result)
                # allow_nan=False: bare NaN is not JSON; _vectors has turned non-finite values into null
                record = self._record(i, result)
                line = (json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
                spans[i] = (spool.tell(), len(line))
                spool.write(line)
            summary = self.finish()
            with open(self.tmp, "wb") as out:
                for i in range(self.n_texts):
                    _copy_span(spool, out, *spans[i])
        return summary

    def _vectors(self, array: np.ndarray) -> list:
        # float32 -> Python float is exact, so reading the numbers back gives the same float32.
        array = array.astype(self.dtype, copy=False)
        finite = np.isfinite(array)
        if finite.all():
            return array.tolist()
        as_objects = array.astype(object)
        as_objects[~finite] = None  # NaN/inf are not JSON: null (as pandas writes them)
        return as_objects.tolist()

    def _record(self, index: int, result: Result) -> dict:
        record: dict = {"id": index, "model": self.meta.get("model"), "text": self.texts[index]}
        if self.text_pairs is not None:
            record["text_pair"] = self.text_pairs[index]
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


def read_npz_texts(npz, name: str = "texts") -> list[str]:
    """The texts (or ``name="text_pairs"``) of a layerwise ``.npz`` opened with ``numpy.load``."""
    if f"{name}_utf8" not in npz.files:
        return npz[name].tolist() if name in npz.files else []  # format_version 1
    data, offsets = npz[f"{name}_utf8"].tobytes(), npz[f"{name}_offsets"]
    bounds = itertools.pairwise(offsets.tolist())
    return [data[a:b].decode("utf-8", "surrogatepass") for a, b in bounds]


def _copy_span(src: IO[bytes], dst: IO[bytes], start: int, length: int) -> None:
    src.seek(start)
    dst.write(src.read(length))
