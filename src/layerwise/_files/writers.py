"""Write extraction results to .npz, .jsonl or .parquet, streaming and atomically.

The corpus is read and extracted block by block (corpus.py); within a block results arrive in
compute order (longest inputs first) and the writers (blocks.py, parquet.py) put them
in input order, so memory stays bounded by one block, never the corpus. Files are written under a
temporary name next to the target and renamed at the end: an error or an interrupt never leaves a
half-written file behind.

.npz layout (``numpy.load`` reads it; no pickle)::

    meta                  JSON string: format, version, model, layers, pool, fuse, dtype, n_texts, ...
    layers                (n_layers,) int32: hidden-state indices, 0 = embedding output
    texts_utf8            (total bytes,) uint8: every text's UTF-8 bytes, one after another
    texts_offsets         (n_texts + 1,) int64: text i is texts_utf8[offsets[i]:offsets[i + 1]]
    text_pairs_utf8, text_pairs_offsets   the same for the second segments, when there are pairs
    ids                   (n_texts,) int64: each input's id (--id-column, else its 0-based row);
                          string ids as ids_utf8 + ids_offsets (``read_npz_ids`` reads either)
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
.parquet: pooled vectors, one row per input (parquet.py).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .._features.names import OutputDtype
from .._results import LayerStack, SentenceVector, WordVectors
from ..errors import LayerwiseError, OptionError, OutputError, check_choice

if TYPE_CHECKING:
    from .._encoder import Encoder
    from .._features.plan import OutputPlan
    from .._inputs.corpus import Corpus
    from .blocks import Writer

logger = logging.getLogger("layerwise")
FORMATS = (".npz", ".jsonl", ".parquet")
Result = LayerStack | WordVectors | SentenceVector
BLOCK_BYTES = 64 << 20  # a block's pooled results held for Parquet's input order: about this much


def output_format(path: str | Path, level: str | None = None) -> str:
    """An output file's format, from its suffix; with ``level`` (the plan's: token, word or
    sentence), also whether the format holds such rows (Parquet holds pooled ones). The writers and
    the CLI ask this before any work, the CLI before it loads a model."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise OptionError(
            f"output {str(path)!r} has an unknown suffix {suffix!r}; use .npz (compact arrays), .jsonl, "
            ".parquet (pooled vectors as a table) or a folder ending in .lw (a store)"
        )
    if suffix == ".parquet" and level is not None:
        from .parquet import check_parquet_plan

        check_parquet_plan(level)
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
    if directory.exists() and not directory.is_dir():
        raise OptionError(
            f"{str(path)!r}: {str(directory)!r} is a file, not a folder; name a file in a folder"
        )
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
    corpus: Corpus | Iterable[str] | str | os.PathLike,
    path: str | os.PathLike,
    plan: OutputPlan | None = None,
    *,
    keep_text: bool = True,
    source: str | None = None,
    progress: bool | None = None,
) -> dict:
    """Extract ``corpus`` as ``plan`` says (default: every layer of every token, float32) and write
    it to ``path`` (.npz, .jsonl, or .parquet for pooled vectors), streaming, in input order;
    nothing is written on error. Returns counts: n_texts, n_tokens, n_words, n_truncated, n_skipped.

    ``corpus`` is a :class:`~layerwise.Corpus` (files and their columns: ``lw.Corpus("t.csv",
    text_column="body", id_column="doc")``; texts in memory with pairs or ids:
    ``lw.Corpus.from_inputs(texts, text_pairs=…, ids=…)``), a list of texts, or a path read with the
    default columns. ``keep_text=False`` leaves the texts out of every format. The file's metadata
    says how it was made (``lw.read_meta``)."""
    from .._features.plan import OutputPlan
    from .._inputs.corpus import as_corpus

    plan = OutputPlan() if plan is None else plan
    if not isinstance(plan, OutputPlan):
        raise OptionError(f"plan must be a layerwise.OutputPlan, not {type(plan).__name__}")
    path = Path(path)
    fmt = output_format(path, plan.level)  # before any work
    plan = encoder.settle(plan)
    corpus = as_corpus(corpus)
    scan = corpus.scan()  # every row checked before anything is written
    meta = {
        **encoder.run_meta(plan),
        "source": source if source is not None else corpus.describe(),
        "corpus": corpus.reading,  # how the source was read: format, columns, limit, bad rows, encoding
        "id_column": corpus.reading.get("id_column"),
        "n_skipped": scan.n_skipped,
        "keep_text": keep_text,
    }
    writer_class = writer_class_of(fmt)
    size = _block_size(plan, encoder, fmt)
    from .blocks import Contents

    contents = Contents(scan.n_texts, scan.has_pairs, scan.id_kind, keep_text)
    summary = write_output(
        path,
        lambda tmp: writer_class(tmp, meta, plan.dtype, contents),
        lambda writer: _extract_blocks(encoder, corpus, writer, plan, size, progress),
    )
    if summary["n_truncated"]:
        logger.warning(
            "%d of %d texts were longer than %d tokens and were truncated; their rows say truncated. Pass "
            "long_texts='window' (--long-texts window) to keep every token.",
            summary["n_truncated"],
            summary["n_texts"],
            encoder.max_length,
        )
    if scan.n_skipped:
        logger.warning(
            "skipped %d bad row(s) (first: %s)", scan.n_skipped, scan.skipped[0] if scan.skipped else "?"
        )
    return {**summary, "n_skipped": scan.n_skipped}


def writer_class_of(fmt: str) -> type[Writer]:
    from .blocks import JsonlWriter, NpzWriter

    if fmt == ".parquet":
        from .parquet import ParquetWriter

        return ParquetWriter
    return NpzWriter if fmt == ".npz" else JsonlWriter


def _block_size(plan: OutputPlan, encoder: Encoder, fmt: str) -> int:
    """Texts per block: Parquet holds a block's pooled results to write them in input order (about
    BLOCK_BYTES); the other formats write results as they come, and a block bounds the tokenised
    texts held. Large blocks keep batches full (inputs are sorted by length within a block)."""
    if fmt != ".parquet":
        return 4096
    row = 4 * int(np.prod(plan.row_shape(encoder.hidden_size, encoder.n_hidden_states)))
    if plan.level == "word":
        row *= 32  # words per text, generously
    return max(256, min(4096, BLOCK_BYTES // row))


def _extract_blocks(
    encoder: Encoder,
    corpus: Corpus,
    writer: Writer,
    plan: OutputPlan,
    size: int,
    progress: bool | None,
) -> dict:
    from .._host.memory import release_free_memory
    from .._host.progress import progress_bar
    from .._inputs.ahead import ahead

    n_texts = len(corpus)
    bar = progress_bar("extracting", "texts", progress) if progress is not False and n_texts > size else None
    with bar if bar is not None else contextlib.nullcontext():
        task = bar.add_task("extract", total=n_texts) if bar is not None else None

        def start(block):  # tokenised on a thread while the block before runs (inputs/ahead.py)
            return encoder.iter_results(
                plan,
                block.texts if block.words is None else None,
                text_pairs=block.text_pairs,
                words=block.words,
                progress=False,
                report_truncation=False,
            )

        for block, outputs in ahead(corpus.blocks(size), start):
            writer.begin(block)
            if len(block):
                for local, stack, result in outputs:
                    writer.put(block.start + local, result, stack.n_tokens, stack.empty)
                    release_free_memory()  # RSS follows the batch, not the corpus (memory.py)
                    if bar is not None and task is not None:
                        bar.advance(task, 1)
            writer.end_block()
    return writer.finish()


def write_output(path: Path, make, fill) -> dict:
    """``fill(writer)`` for a writer ``make(tmp)`` makes on a temporary file that becomes ``path``
    only when all went well."""
    try:
        with atomic_path(path) as tmp:
            writer = make(tmp)
            try:
                result = fill(writer)
            except BaseException:
                # closing what the error interrupted can fail too (an .npz entry left open by SIGTERM
                # or Ctrl-C mid-write): the error that stopped the write is the one to report
                with contextlib.suppress(Exception):
                    writer.close()
                raise
            writer.close()
            return result
    except OSError as exc:
        if isinstance(exc, LayerwiseError):
            raise
        raise OutputError(
            f"writing {str(path)!r} failed: {exc.strerror or exc}; nothing was written. Free some space "
            "(an .npz of every layer takes hidden x layers x 4 bytes per token) or choose another folder, "
            "then rerun"
        ) from exc


def write_results(
    path: str | Path,
    results: Iterable[tuple[int, Result]],
    *,
    texts: Sequence[str],
    text_pairs: Sequence[str] | None = None,
    meta: dict,
    dtype: OutputDtype = "float32",
) -> dict:
    """Write ``(index, result)`` pairs for ``texts`` to ``path`` (.npz, .jsonl or .parquet); a
    result is a LayerStack, a WordVectors or a SentenceVector. Returns summary counts."""
    check_choice("dtype", dtype, ("float32", "float16"))
    path = Path(path)
    writer_class = writer_class_of(output_format(path))
    from .blocks import Contents

    return write_output(
        path,
        lambda tmp: writer_class(tmp, meta, dtype, Contents(len(texts), text_pairs is not None)),
        lambda writer: _write_one_block(writer, results, texts, text_pairs),
    )


def _write_one_block(writer: Writer, results, texts, text_pairs) -> dict:
    from .._inputs.corpus import Block

    pairs = list(text_pairs) if text_pairs is not None else None
    writer.begin(Block(0, list(texts), pairs, None, list(range(len(texts)))))
    for index, result in results:
        if isinstance(result, LayerStack):
            writer.put(index, result, result.n_tokens, result.empty)
        else:  # pooled already: the text says whether it was empty
            writer.put(index, result, 0, not texts[index].strip())
    writer.end_block()
    return writer.finish()


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

    from .blocks import Contents, NpzWriter

    check_choice("dtype", dtype, ("float32", "float16"))
    buffer = io.BytesIO()
    writer = NpzWriter(buffer, meta, dtype, Contents(len(texts), text_pairs is not None))
    try:
        _write_one_block(writer, results, texts, text_pairs)
    finally:
        writer.close()
    return buffer.getvalue()


def read_npz_ids(npz) -> list:
    """The ids of a layerwise ``.npz`` (ints or strings); before format 3: the 0-based rows."""
    if "ids_utf8" in npz.files:
        return read_npz_texts(npz, "ids")
    if "ids" in npz.files:
        return npz["ids"].tolist()
    return list(range(len(npz["truncated"])))


def read_npz_texts(npz, name: str = "texts") -> list[str]:
    """The texts (or ``name="text_pairs"``) of a layerwise ``.npz`` opened with ``numpy.load``."""
    if f"{name}_utf8" not in npz.files:
        return npz[name].tolist() if name in npz.files else []  # format_version 1
    data, offsets = npz[f"{name}_utf8"].tobytes(), npz[f"{name}_offsets"]
    bounds = itertools.pairwise(offsets.tolist())
    return [data[a:b].decode("utf-8", "surrogatepass") for a, b in bounds]
