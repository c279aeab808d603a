"""Reading one corpus file, chunk by chunk, as raw column values (checked later, in corpus.py).

    txt      one text per line; a blank line is an empty text (result i is line i + 1)
    tsv      without --text-column: two tab-separated columns per line, a sentence pair
    jsonl    one JSON object per line; fields named by the columns ("text"/"text_pair" by default)
    csv      a table with a header row (pyarrow.csv, streamed); tsv with --text-column likewise
    parquet  row group by row group (pyarrow.parquet)

Each of them may be compressed (.gz, .zst, .bz2, .xz, by suffix) except Parquet, which compresses
inside. A chunk holds at most CHUNK_ROWS rows, so memory follows the chunk, not the file. Line
formats record each row's line number and byte offset; a later reader starts at such an offset
(a Ray actor reading its own shard) without reading what comes before.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import io
import json
import lzma
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, get_args

from ..errors import InputError, MissingDependencyError, OptionError

CHUNK_ROWS = 4096
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
# how a corpus' files are read: their format, invalid UTF-8 in them, and a row that holds no text
Format = Literal["txt", "tsv", "jsonl", "csv", "parquet"]
FORMATS: tuple[str, ...] = get_args(Format)
EncodingErrors = Literal["strict", "replace"]
ENCODING_ERRORS: tuple[str, ...] = get_args(EncodingErrors)
BadRow = Literal["error", "skip"]
BAD_ROWS: tuple[str, ...] = get_args(BadRow)
_BY_SUFFIX = {
    ".txt": "txt",
    ".text": "txt",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_REFUSED = {".json": "one JSON document (write one object per line: .jsonl)", ".zip": "an archive"}
# archives and compressions layerwise does not read: refused, never read as plain text
_ARCHIVES = {".tar", ".tgz", ".tbz2", ".txz", ".7z", ".rar"}  # .zip: _REFUSED
_OTHER_COMPRESSIONS = {".lz4", ".lzma", ".lz", ".br", ".snappy", ".sz", ".z"}
MISSING = object()  # a JSON Lines record without the field (None is an explicit null)


@dataclass(frozen=True)
class Bad:
    """A value that could not even be read (invalid UTF-8, a line that is not JSON): the reason."""

    reason: str


@dataclass(frozen=True)
class FileFormat:
    """How to read a file: its format and compression, and whether its table has a header."""

    format: str
    compression: str | None = None

    @property
    def lines(self) -> bool:  # one row per line: line numbers and byte offsets are known
        return self.format in ("txt", "tsv", "jsonl")


def detect_format(path: Path, given: str | None) -> FileFormat:
    """The format from ``given`` (--format) or the suffixes: corpus.jsonl.zst is zstd JSON Lines."""
    suffixes = [s.lower() for s in path.suffixes]
    archive = next((s for s in suffixes if s in _ARCHIVES), None)
    if archive is not None:
        raise InputError(
            f"{str(path)!r} is an archive ({archive}); layerwise reads files, not archives: extract it "
            "(tar -xf, unzip) and pass the files or their folder"
        )
    if suffixes and suffixes[-1] in _OTHER_COMPRESSIONS:
        raise InputError(
            f"{str(path)!r}: {suffixes[-1]} compression is not read; decompress it, or recompress it as "
            ".gz, .zst, .bz2 or .xz"
        )
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression is not None:
        suffixes = suffixes[:-1]
    if given is not None:
        if given not in FORMATS:
            raise OptionError(f"--format {given!r} is not one of {', '.join(FORMATS)}")
        fmt = given
    else:
        last = suffixes[-1] if suffixes else ""
        if last in _REFUSED:
            raise InputError(
                f"{str(path)!r}: {last} files are not read as {_REFUSED[last]}; layerwise reads "
                f"{', '.join(FORMATS)} (optionally .gz/.zst/.bz2/.xz)"
            )
        fmt = _BY_SUFFIX.get(last, "txt")  # anything else: one text per line, as always
    if fmt == "parquet" and compression is not None:
        raise InputError(
            f"{str(path)!r}: a Parquet file compresses its own columns; decompress the file, or write it "
            "with compression='zstd' inside"
        )
    return FileFormat(fmt, compression)


def open_binary(path: Path, compression: str | None) -> IO[bytes]:
    """``path`` opened for reading bytes, decompressed on the fly."""
    if compression is None:
        return open(path, "rb")
    if compression == "gzip":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if compression == "bz2":
        return bz2.open(path, "rb")
    if compression == "xz":
        return lzma.open(path, "rb")
    try:
        import zstandard
    except ImportError as exc:
        raise MissingDependencyError(
            f"{path.name}: reading .zst needs zstandard: pip install 'layerwise[io]' (or zstandard)"
        ) from exc
    # a buffered reader over the frames gives readline and line iteration
    return io.BufferedReader(_ZstdFrames(open(path, "rb"), zstandard), buffer_size=1 << 20)


class _ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a .zst file's frames, one after another. zstandard's stream reader
    ends quietly at a file cut in the middle of a frame (a truncated copy read as a shorter corpus
    with a cut last line); here that is an EOFError, as gzip, bz2 and lzma raise it."""

    def __init__(self, raw: IO[bytes], zstandard: Any) -> None:
        self.raw, self.zstandard = raw, zstandard
        self.frame = zstandard.ZstdDecompressor().decompressobj()
        self.pending, self.given = b"", 0  # decompressed bytes, and how many of them were read
        self.started = False  # a frame has begun and not ended

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self.given == len(self.pending):
            data = self.raw.read(1 << 20)
            if not data:
                if self.started:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                return 0
            pieces = []
            while data:
                self.started = True
                pieces.append(self.frame.decompress(data))
                if not self.frame.eof:
                    break
                data, self.started = self.frame.unused_data, False  # the next frame, if any
                self.frame = self.zstandard.ZstdDecompressor().decompressobj()
            self.pending, self.given = b"".join(pieces), 0
        # hand out the decompressed bytes from an offset: no copy of the rest on every read
        size = min(len(buffer), len(self.pending) - self.given)
        buffer[:size] = memoryview(self.pending)[self.given : self.given + size]
        self.given += size
        return size

    def close(self) -> None:
        self.raw.close()
        super().close()


@dataclass
class RawChunk:
    """Up to CHUNK_ROWS rows: one list per requested column ("text", "pair", "id", "words"),
    ``where[i]`` the 1-based line (line formats) or data row (tables) of row i, ``offsets[i]`` the
    byte offset its line starts at (uncompressed line formats), ``first_row`` the file's 0-based
    row number of row 0."""

    first_row: int
    values: dict[str, list] = field(default_factory=dict)
    where: list[int] = field(default_factory=list)
    offsets: list[int] | None = None

    def __len__(self) -> int:
        return len(self.where)


@dataclass(frozen=True)
class Start:
    """Where to start reading a file: its 0-based row, and for line formats the 1-based line and
    byte offset of that row (None: read from the top and skip the rows before)."""

    row: int = 0
    line: int = 1
    offset: int | None = None


# ---------------------------------------------------------------------------------------- lines
def line_chunks(
    path: Path, fmt: FileFormat, columns: dict[str, str], errors: str, start: Start, strict_fields: bool
) -> Iterator[RawChunk]:
    parse = {"txt": _txt_row, "tsv": _tsv_row, "jsonl": _jsonl_row}[fmt.format]
    names = dict(columns)  # role -> field name (JSON Lines); txt and pair .tsv have fixed roles
    if fmt.format == "txt":
        names = {"text": "text"}
    elif fmt.format == "tsv":
        names = {"text": "text", "pair": "pair"}
    seekable = fmt.compression is None
    with open_binary(path, fmt.compression) as handle:
        position, line, row = 0, 1, 0
        if start.offset is not None and seekable:
            handle.seek(start.offset)
            position, line, row = start.offset, start.line, start.row
        chunk = RawChunk(row, {role: [] for role in names}, [], [] if seekable else None)
        for raw in handle:
            here, number = position, line
            position += len(raw)
            line += 1
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte-order mark
            raw = raw.removesuffix(b"\n").removesuffix(b"\r")
            # an empty line separates records in .tsv (a whitespace-only one is an error there) and
            # .jsonl; in .txt it is an empty text
            blank = not raw if fmt.format == "tsv" else (fmt.format == "jsonl" and not raw.strip())
            if blank:
                continue
            if row < start.row:
                row += 1
                continue
            row += 1
            values = parse(raw, number, errors, names, strict_fields)
            for role in names:
                chunk.values[role].append(values.get(role, MISSING))
            chunk.where.append(number)
            if chunk.offsets is not None:
                chunk.offsets.append(here)
            if len(chunk) >= CHUNK_ROWS:
                yield chunk
                chunk = RawChunk(row, {role: [] for role in names}, [], [] if seekable else None)
        if len(chunk):
            yield chunk


def decode_line(raw: bytes, errors: str) -> str | Bad:
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        return Bad(
            f"is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line); "
            "re-encode the file (iconv -f latin1 -t utf-8), or pass --encoding-errors replace"
        )


def _txt_row(raw: bytes, number: int, errors: str, names: dict, strict: bool) -> dict:
    return {"text": decode_line(raw, errors)}


def _tsv_row(raw: bytes, number: int, errors: str, names: dict, strict: bool) -> dict:
    line = decode_line(raw, errors)
    if isinstance(line, Bad):
        return {"text": line}
    if not line.strip():
        return {"text": Bad(f"holds only whitespace ({line!r}); a .tsv line is a pair of texts")}
    parts = line.split("\t")
    if len(parts) != 2:
        return {
            "text": Bad(
                f"has {len(parts)} tab-separated column(s); a .tsv input without --text-column needs "
                "exactly two (first segment, second segment): use .txt for single texts, or give the "
                "file a header row and pass --text-column"
            )
        }
    return {"text": parts[0], "pair": parts[1]}


_JSONL_FIELDS = ("text", "text_pair")


def _near_miss(record: dict) -> tuple[str, str] | None:
    """``(field, known field)`` for a field of ``record`` that looks like a misspelling of "text"
    or "text_pair" (which the record lacks), else None."""
    for name in record:
        if name in _JSONL_FIELDS or not isinstance(name, str):
            continue
        for known in _JSONL_FIELDS:
            if known not in record and _looks_like(name, known):
                return name, known
    return None


@functools.lru_cache(maxsize=1024)
def _looks_like(name: str, known: str) -> bool:
    """``name`` is ``known`` misspelt. Cached: a corpus repeats its field names on every line, and
    comparing them (difflib) costs more than parsing the line."""
    import difflib

    return name.lower() == known or difflib.SequenceMatcher(None, name.lower(), known).ratio() >= 0.8


def _jsonl_row(raw: bytes, number: int, errors: str, names: dict, strict: bool) -> dict:
    line = decode_line(raw, errors)
    if isinstance(line, Bad):
        return {"text": line}
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        return {"text": Bad(f"is not valid JSON ({exc.msg})")}
    except RecursionError:
        return {"text": Bad("is nested too deeply to be a text record")}
    if not isinstance(record, dict):
        return {"text": Bad(f'is a JSON {type(record).__name__}, not an object such as {{"text": "..."}}')}
    if strict:
        # other fields ("label", "id", … as on most hub datasets) are left alone, as CSV and Parquet
        # columns are; a near miss of a known one ("text_pairs", "Text") would silently drop a
        # segment, so it is an error that names the right field
        near = _near_miss(record)
        if near is not None:
            field, known = near
            return {
                "text": Bad(
                    f"has the field {field!r}, not {known!r}: rename it to {known!r}, or name the fields to "
                    "read with --text-column / --pair-column"
                )
            }
        if not isinstance(record.get("text"), str):
            return {
                "text": Bad(
                    'needs an object with a string "text" field, e.g. {"text": "The bank raised rates."}'
                )
            }
    values = {role: record.get(name, MISSING) for role, name in names.items()}
    for role in ("text", "words"):
        if values.get(role) is MISSING:
            fields = ", ".join(map(repr, record)) or "none"
            values[role] = Bad(f"has no field {names[role]!r} (its fields: {fields}); pass --{role}-column")
    return values
