"""Tables in: Parquet and CSV (and TSV with a header) read with pyarrow, in chunks of rows.

Parquet is read a row group at a time with the requested columns only; CSV in blocks that grow for
a larger row. CSV texts are read as bytes and decoded row by row, so that invalid UTF-8 names its
row (or is replaced, with ``--encoding-errors replace``), as in the line formats (formats.py).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from .._settings.extras import require
from ..errors import InputError, OptionError
from .formats import CHUNK_ROWS, FileFormat, RawChunk, decode_line, open_binary


def _check_columns(path: Path, columns: dict[str, str], present: list[str]) -> None:
    for role, name in columns.items():
        if name not in present:
            raise InputError(
                f"{path}: no column {name!r} (--{role}-column); its columns are "
                f"{', '.join(map(repr, present))}"
            )


def require_pyarrow(what: str) -> Any:
    require("io", f"reading {what}")  # missing or broken: one line naming the pip command or the cause
    import pyarrow

    return pyarrow


def parquet_chunks(path: Path, columns: dict[str, str], start_row: int) -> Iterator[RawChunk]:
    require_pyarrow("Parquet")
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
    with handle:
        _check_columns(path, columns, handle.schema_arrow.names)
        _check_types(path, columns, handle.schema_arrow)
        # start at the row group that holds start_row: the groups before it are never read
        first_group, row = 0, 0
        meta = handle.metadata
        while first_group < meta.num_row_groups and row + meta.row_group(first_group).num_rows <= start_row:
            row += meta.row_group(first_group).num_rows
            first_group += 1
        groups = list(range(first_group, meta.num_row_groups))
        if not groups:
            return
        wanted = list(dict.fromkeys(columns.values()))
        for batch in handle.iter_batches(batch_size=CHUNK_ROWS, row_groups=groups, columns=wanted):
            if row + batch.num_rows <= start_row:
                row += batch.num_rows
                continue
            skip = max(0, start_row - row)
            batch = batch.slice(skip)
            row += skip
            yield _table_chunk(batch, columns, row)
            row += batch.num_rows


def _check_types(path: Path, columns: dict[str, str], schema: Any) -> None:
    import pyarrow as pa

    def plain(kind):
        return kind.value_type if pa.types.is_dictionary(kind) else kind

    for role in ("text", "pair"):
        if role in columns:
            kind = plain(schema.field(columns[role]).type)
            if not _is_text(pa, kind):
                raise InputError(
                    f"{path}: column {columns[role]!r} (--{role}-column) holds {kind}, not text; "
                    "name a string column"
                )
    if "words" in columns:
        kind = plain(schema.field(columns["words"]).type)
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list_view(kind)):
            raise InputError(
                f"{path}: column {columns['words']!r} (--words-column) holds {kind}, not a list of words; "
                "name a list<string> column (pre-split words, one list per row)"
            )


def _is_text(pa: Any, kind: Any) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind))


def _table_chunk(batch: Any, columns: dict[str, str], first_row: int, errors: str | None = None) -> RawChunk:
    """A batch's requested columns as a chunk; ``errors``: text columns were read as bytes (CSV)
    and are decoded here, so that invalid UTF-8 names its row (or is replaced, as asked)."""
    index = batch.schema.get_field_index
    values = {role: batch.column(index(name)).to_pylist() for role, name in columns.items()}
    if errors is not None:
        for role in ("text", "pair"):
            if role in values:
                values[role] = [None if v is None else decode_line(v, errors) for v in values[role]]
    return RawChunk(first_row, values, list(range(first_row + 1, first_row + 1 + batch.num_rows)), None)


# pyarrow's CSV reader parses in blocks, and a row must fit one: the block grows for a larger row
CSV_BLOCK = 1 << 20
CSV_MAX_BLOCK = 1 << 30


def csv_chunks(
    path: Path, fmt: FileFormat, columns: dict[str, str], start_row: int, errors: str = "strict"
) -> Iterator[RawChunk]:
    pa = require_pyarrow("CSV")

    if "words" in columns:
        raise OptionError(
            f"{path}: --words-column needs a list column, which CSV cannot hold; use Parquet or JSON Lines "
            "for pre-split words"
        )
    delimiter = "\t" if fmt.format == "tsv" else ","
    with open_binary(path, fmt.compression) as handle:
        header = _header(path, handle, delimiter)
    _check_columns(path, columns, header)
    # texts as bytes, decoded row by row (_table_chunk): invalid UTF-8 is named by its row
    kinds = {name: pa.binary() for role, name in columns.items() if role in ("text", "pair")}
    block, row = CSV_BLOCK, start_row
    while True:
        ragged: list[Any] = []
        try:
            for chunk in _csv_blocks(path, fmt, columns, kinds, delimiter, block, row, ragged, errors):
                yield chunk
                row = chunk.first_row + len(chunk)
            return
        except pa.ArrowInvalid as exc:
            if ragged:
                bad = ragged[0]
                after = f" (after data row {row})" if row else ""
                raise InputError(
                    f"{path}: a row has {bad.actual_columns} column(s) where the header has "
                    f"{bad.expected_columns}: {bad.text!r:.80}{after}; quote a field that holds "
                    f"{'a tab' if delimiter == chr(9) else 'a comma'} or a line break, or fix the row"
                ) from None
            if "straddl" in str(exc) and block < CSV_MAX_BLOCK:
                block *= 8  # a row larger than the block: read again from the first row not yet given
                continue
            if "straddl" in str(exc):
                raise InputError(
                    f"{path}: a row after row {row} is over {CSV_MAX_BLOCK >> 20} MiB; split it"
                ) from None
            raise InputError(f"{path}: cannot be read as {fmt.format.upper()} ({exc})") from None


def _csv_blocks(path, fmt, columns, kinds, delimiter, block, start_row, ragged, errors) -> Iterator[RawChunk]:
    import pyarrow.csv as pcsv

    def invalid(row: Any) -> str:
        ragged.append(row)
        return "error"

    with open_binary(path, fmt.compression) as raw:
        handle = _QuoteCounter(raw)
        reader = pcsv.open_csv(
            handle,
            read_options=pcsv.ReadOptions(block_size=block),
            parse_options=pcsv.ParseOptions(
                delimiter=delimiter, newlines_in_values=True, invalid_row_handler=invalid
            ),
            # an empty cell is a missing value (a null); a quoted "" is an empty text
            convert_options=pcsv.ConvertOptions(
                include_columns=list(dict.fromkeys(columns.values())),
                column_types=kinds,
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
            ),
        )
        row = 0
        for batch in reader:
            for piece in _pieces(batch):
                if row + piece.num_rows > start_row:
                    skip = max(0, start_row - row)
                    yield _table_chunk(piece.slice(skip), columns, row + skip, errors)
                row += piece.num_rows
    if handle.quotes % 2:
        _check_quotes_closed(path, fmt, delimiter)


class _QuoteCounter(io.RawIOBase):
    """The file as pyarrow reads it, counting its quote characters on the way (C speed): in CSV
    every quote that opens a field is closed and an escaped one is doubled, so an odd count means
    a quoted field that runs to the end of the file (pyarrow reads it as one text) or a bare
    quote inside an unquoted field (allowed): :func:`_check_quotes_closed` tells which."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.quotes = raw, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.raw.read(len(buffer))
        buffer[: len(data)] = data
        self.quotes += data.count(b'"')
        return len(data)


def _check_quotes_closed(path: Path, fmt: FileFormat, delimiter: str) -> None:
    """Python's csv reader in strict mode fails only at a quoted field left open at the end."""
    import csv

    with open_binary(path, fmt.compression) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
        rows = csv.reader(text, delimiter=delimiter, strict=True)
        n = -1  # rows read whole; the header is row 0
        try:
            for _ in rows:
                n += 1
        except csv.Error:
            raise InputError(
                f"{path}: row {n + 1} opens a quoted field that is never closed: the quote runs to the end "
                "of the file. Close the quote (a quote inside a quoted field is written twice) or remove it",
                index=n,
            ) from None


def _pieces(batch: Any) -> Iterator[Any]:
    for start in range(0, batch.num_rows, CHUNK_ROWS):
        yield batch.slice(start, CHUNK_ROWS)


def _header(path: Path, handle: IO[bytes], delimiter: str) -> list[str]:
    import csv
    import io

    first = handle.readline().removeprefix(b"\xef\xbb\xbf")
    try:
        text = first.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: the header row is not valid UTF-8; re-encode the file") from None
    names = next(csv.reader(io.StringIO(text), delimiter=delimiter), [])
    if not names:
        raise InputError(f"{path} is empty: a table needs a header row naming its columns")
    return names
