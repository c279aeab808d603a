"""A corpus: texts (with pairs, pre-split words and ids) read from files in blocks, never whole.

    corpus = Corpus("data/*.parquet", text_column="body", id_column="doc_id", on_bad_row="skip")
    corpus.scan()                      # one pass: checks every row, counts texts, finds their ids' type
    for block in corpus.blocks(2048):  # then texts in input order, a block at a time
        block.texts, block.ids

A source is a file, several files (a glob, a folder: in sorted order), or ``-`` for standard input
(spooled to a temporary file, which is read twice). Formats: formats.py. ``scan`` reads the
corpus once before any work, so a bad row stops the run before anything is written (or, with
``on_bad_row="skip"``, is skipped and counted, the same way in every later pass); it also records
where chosen texts start, so that a reader (a Ray actor) can begin there. In-memory inputs go
through the same interface: :meth:`Corpus.from_inputs`.
"""

from __future__ import annotations

import glob
import os
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, LayerwiseError, OptionError, check_choice
from .chunks import read_chunks
from .formats import (
    BAD_ROWS,
    ENCODING_ERRORS,
    MISSING,
    Bad,
    BadRow,
    EncodingErrors,
    FileFormat,
    Format,
    Start,
    detect_format,
)
from .raw import RawInputs, normalize_inputs
from .scan import Scan, pick_ranges, range_sizes, scan_memory, scan_rows
from .sources import (
    check_ids,
    column_roles,
    find_files,
    one_format,
    remove_file,
    row_problem,
)

SKIPPED_SHOWN = 20  # the first skipped rows are listed; all of them are counted


@dataclass(frozen=True)
class Block:
    """Consecutive texts of a corpus: text ``start + i`` is ``texts[i]``."""

    start: int
    texts: list[str]
    text_pairs: list[str] | None
    words: list[tuple[str, ...]] | None
    ids: list

    def __len__(self) -> int:
        return len(self.texts)

    def raw(self) -> RawInputs:
        field_name = "words" if self.words is not None else "texts"
        return RawInputs(self.texts, self.text_pairs, self.words, field_name)


class Corpus:
    """Texts from files (see the module docstring), or from memory (:meth:`from_inputs`)."""

    def __init__(
        self,
        source: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        format: Format | None = None,
        text_column: str | None = None,
        pair_column: str | None = None,
        id_column: str | None = None,
        words_column: str | None = None,
        limit: int | None = None,
        on_bad_row: BadRow = "error",
        encoding_errors: EncodingErrors = "strict",
    ) -> None:
        check_choice("on_bad_row", on_bad_row, BAD_ROWS)
        check_choice("encoding_errors", encoding_errors, ENCODING_ERRORS)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise OptionError(f"limit={limit!r} must be a whole number >= 1 (the first N texts)")
        if text_column is not None and words_column is not None:
            raise OptionError("pass --text-column or --words-column, not both (words make the text)")
        self.limit, self.on_bad_row, self.encoding_errors = limit, on_bad_row, encoding_errors
        if not isinstance(source, str | os.PathLike):
            source = list(source)  # read once here and once by find_files: not a one-shot iterator
        named = [source] if isinstance(source, str | os.PathLike) else source
        if format is None and any(os.fspath(s) == "-" for s in named if isinstance(s, str | os.PathLike)):
            format = "txt"  # standard input with no --format: one text per line, as cat users expect
        self.reading = {
            "format": format,
            "text_column": text_column,
            "pair_column": pair_column,
            "id_column": id_column,
            "words_column": words_column,
            "limit": limit,
            "on_bad_row": on_bad_row,
            "encoding_errors": encoding_errors,
        }
        self._memory: RawInputs | None = None
        self._memory_ids: list | None = None
        self._spool: Path | None = None
        self.files = self._find_files(source, format)
        self.format = one_format(self.files, format, self._spool)
        self.columns = column_roles(self.format.format, text_column, pair_column, id_column, words_column)
        # the default JSON Lines form ({"text", "text_pair"}, other fields ignored) refuses a near
        # miss of either: a misspelt "text_pair" would silently leave its text unpaired
        self.strict_fields = self.format.format == "jsonl" and not any(
            (text_column, pair_column, id_column, words_column)
        )
        self._scan: Scan | None = None

    @classmethod
    def from_inputs(
        cls,
        texts: Sequence[str] | None = None,
        *,
        text_pairs: Sequence[str] | None = None,
        words: Sequence[Sequence[str]] | None = None,
        ids: Sequence | None = None,
    ) -> Corpus:
        """A corpus of texts already in memory (checked now, each error naming its index)."""
        corpus = cls.__new__(cls)
        corpus.limit, corpus.on_bad_row, corpus.encoding_errors = None, "error", "strict"
        corpus._memory = normalize_inputs(texts, text_pairs=text_pairs, words=words)
        corpus._memory_ids = check_ids(ids, len(corpus._memory)) if ids is not None else None
        corpus._spool, corpus.files, corpus._scan = None, [], None
        corpus.format, corpus.columns, corpus.strict_fields = FileFormat("memory"), {}, False
        corpus.reading = {}
        return corpus

    # ------------------------------------------------------------------ sources
    def _find_files(self, source, given_format: str | None) -> list[Path]:
        files, self._spool = find_files(source, given_format)
        if self._spool is not None:
            weakref.finalize(self, remove_file, str(self._spool))
        return files

    def _file_format(self, path: Path) -> FileFormat:
        if self.format.compression != "per-file":
            return self.format
        return detect_format(path, self.format.format)

    # ------------------------------------------------------------------ reading
    def _rows(self, origin: tuple[int, Start, int] = (0, Start(), 0)) -> Iterator[tuple]:
        """``(file index, global row, where, values, Start of the row)`` for every raw row, from
        ``origin`` (file index, where in it, global row of its row 0) on."""
        first_file, start, base = origin
        for k in range(first_file, len(self.files)):
            path = self.files[k]
            begin = start if k == first_file else Start()
            n_rows = begin.row
            chunks = read_chunks(
                path,
                self._file_format(path),
                self.columns,
                encoding_errors=self.encoding_errors,
                start=begin,
                strict_fields=self.strict_fields,
            )
            for chunk in chunks if path != self._spool else _stdin_named(chunks, path):
                offsets = chunk.offsets
                for i in range(len(chunk)):
                    values = {role: column[i] for role, column in chunk.values.items()}
                    offset = offsets[i] if offsets is not None else None
                    here = Start(chunk.first_row + i, chunk.where[i], offset)
                    yield k, base, here, values
                n_rows = chunk.first_row + len(chunk)
            base += n_rows  # the global row of the next file's row 0

    def _check(self, k: int, where: int, values: dict, has_pairs: bool | None) -> tuple | str:
        """``(text, pair, words, id)`` of a good row, or the message that names what is wrong."""
        fmt = self._file_format(self.files[k])
        place = f"{self._name(k)}: {'line' if fmt.lines else 'row'} {where}"
        label = "field" if fmt.format == "jsonl" else "column"
        for role in ("text", "pair", "words", "id"):
            if role not in values:
                continue
            value = values[role]
            column = f", {label} {self.columns[role]!r}" if role in self.columns else ""
            if isinstance(value, Bad):
                return f"{place} {value.reason}"
            if value is MISSING:
                if role == "pair" and self.strict_fields:
                    continue
                return f"{place}{column}: the {label} is missing"
            problem = row_problem(role, value)
            if problem:
                return f"{place}{column}: {problem}"
        pair = values.get("pair")
        pair = None if pair is MISSING else pair
        if self.strict_fields and has_pairs is not None and (pair is not None) != has_pairs:
            return (
                f'{place}: either every line has a "text_pair" or none does (the first '
                f"{'has' if has_pairs else 'has not'}); split the file in two"
            )
        words = tuple(values["words"]) if "words" in values else None
        text = " ".join(words) if words is not None else values["text"]
        return text, pair, words, values.get("id")

    def _name(self, k: int) -> str:
        return "standard input" if self.files[k] == self._spool else str(self.files[k])

    def _good_rows(
        self, scan: Scan, origin: tuple[int, Start, int] = (0, Start(), 0), *, count: bool = False
    ) -> Iterator[tuple]:
        """``(global row, text, pair, words, id, origin of the row)`` for each good row; a bad row
        stops the run (on_bad_row="error") or is skipped (counted in ``scan`` when ``count``)."""
        for k, base, here, values in self._rows(origin):
            checked = self._check(
                k,
                here.line if self._file_format(self.files[k]).lines else here.row + 1,
                values,
                scan.has_pairs if scan.pairs_decided else None,
            )
            if isinstance(checked, str):
                if self.on_bad_row == "error":
                    raise InputError(
                        f"{checked}; fix the row, or pass --on-bad-row skip (Python: on_bad_row='skip') to "
                        "skip and count such rows",
                        line=here.line,
                    )
                if count:
                    scan.n_skipped += 1
                    if len(scan.skipped) < SKIPPED_SHOWN:
                        scan.skipped.append(checked)
                continue
            yield base + here.row, *checked, (k, here, base)

    def scan(self, *, ranges: int | Sequence[int] | None = None) -> Scan:
        """Read the whole corpus once (up to ``limit``): every row is checked, texts counted. With
        ``ranges`` (a size, or several), the start of every ``ranges``-th text is recorded and each
        range's texts hashed, for each size at once (a sharded store's plan, whichever size it picks
        after the count). The result is kept: later calls that ask for no new size return it."""
        sizes = range_sizes(ranges)
        if self._scan is not None and all(size in self._scan.hashes_by_size for size in sizes):
            pick_ranges(self._scan, sizes)
            return self._scan
        scan = Scan()
        if self._memory is not None:
            scan_memory(scan, self._memory, self._memory_ids, sizes)
        else:
            scan_rows(scan, self._good_rows(scan, count=True), sizes, self.limit)
        pick_ranges(scan, sizes)
        self._scan = scan
        return scan

    def __len__(self) -> int:
        return self.scan().n_texts

    @property
    def has_pairs(self) -> bool:
        return self.scan().has_pairs

    @property
    def has_words(self) -> bool:
        return self._memory.words is not None if self._memory is not None else "words" in self.columns

    def blocks(self, size: int, *, start: int = 0, stop: int | None = None) -> Iterator[Block]:
        """Texts ``start`` .. ``stop`` - 1 in blocks of ``size`` (the last one shorter)."""
        scan = self.scan()
        stop = scan.n_texts if stop is None else min(stop, scan.n_texts)
        if self._memory is not None:
            yield from self._memory_blocks(size, start, stop)
            return
        origin, index = (0, Start(), 0), 0
        if start in scan.starts:
            origin, index = scan.starts[start], start
        current: list[tuple] = []
        block_start = start
        for row, text, pair, words, ident, _ in self._good_rows(scan, origin):
            if index >= stop:
                break
            if index >= start:
                current.append((text, pair, words, row if ident is None else ident))
                if len(current) == size:
                    yield self._block(block_start, current, scan)
                    block_start, current = block_start + size, []
            index += 1
        if current:
            yield self._block(block_start, current, scan)

    def _block(self, start: int, rows: list[tuple], scan: Scan) -> Block:
        texts = [r[0] for r in rows]
        pairs = [r[1] for r in rows] if scan.has_pairs else None
        words = [r[2] for r in rows] if self.has_words else None
        cast = int if scan.id_kind == "int" else str
        ids = [cast(r[3]) for r in rows]
        return Block(start, texts, pairs, words, ids)

    def _memory_blocks(self, size: int, start: int, stop: int) -> Iterator[Block]:
        raw = self._memory
        assert raw is not None
        for lo in range(start, stop, size):
            hi = min(lo + size, stop)
            ids = self._memory_ids[lo:hi] if self._memory_ids is not None else list(range(lo, hi))
            yield Block(
                lo,
                raw.texts[lo:hi],
                raw.text_pairs[lo:hi] if raw.text_pairs is not None else None,
                raw.words[lo:hi] if raw.words is not None else None,
                list(ids),
            )

    def describe(self) -> str:
        """The source, for metadata and messages."""
        if self._memory is not None:  # an image corpus (images.py) says which files it found
            return str(self.reading.get("source", "memory"))
        names = [self._name(k) for k in range(len(self.files))]
        return names[0] if len(names) == 1 else f"{names[0]} … ({len(names)} files)"


def _stdin_named(chunks: Iterator, spool: Path) -> Iterator:
    """``chunks`` of standard input, named so in their errors, not by its temporary file."""
    try:
        yield from chunks
    except LayerwiseError as exc:
        raise type(exc)(str(exc).replace(str(spool), "standard input")) from None


def as_corpus(
    source: object,
    *,
    format: Format | None = None,
    text_column: str | None = None,
    encoding_errors: EncodingErrors = "strict",
) -> Corpus:
    """``source`` as a Corpus: a Corpus as it is; a path (str or os.PathLike) read with ``format``,
    ``text_column`` and ``encoding_errors`` (the rest of Corpus' keywords: build the Corpus); any
    other iterable of strings from memory."""
    options = {"format": format, "text_column": text_column, "encoding_errors": encoding_errors}
    given = [name for name, value in options.items() if value not in (None, "strict")]
    if isinstance(source, Corpus):
        if given:
            raise OptionError(f"pass the options ({', '.join(given)}) to the Corpus, not beside it")
        return source
    if isinstance(source, str | os.PathLike):
        name = os.fspath(source)
        if name != "-" and not glob.has_magic(name) and not Path(name).exists():
            raise InputError(
                f"input file {name!r:.80} does not exist (a str is read as a file path; pass texts as a "
                "list of strings)"
            )
        return Corpus(source, format=format, text_column=text_column, encoding_errors=encoding_errors)
    if given:
        raise OptionError(f"{', '.join(given)} read columns of a file; texts in memory have none")
    from .raw import as_texts

    return Corpus.from_inputs(as_texts(source))
