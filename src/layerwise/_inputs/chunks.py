"""Any corpus file, row chunk by row chunk: the line formats (formats.py) and the tables
(tables.py) behind one call, and one answer for a file that cannot be read to its end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..errors import InputError, LayerwiseError
from .formats import FileFormat, RawChunk, Start, line_chunks
from .tables import csv_chunks, parquet_chunks

FROM_THE_TOP = Start()


def read_chunks(
    path: Path,
    fmt: FileFormat,
    columns: dict[str, str],
    *,
    encoding_errors: str = "strict",
    start: Start = FROM_THE_TOP,
    strict_fields: bool = False,
) -> Iterator[RawChunk]:
    """The rows of ``path`` from ``start`` on. ``columns`` maps a role ("text", "pair", "id",
    "words") to the file's column or field name; ``strict_fields``: a JSON Lines record may hold
    no other field (the default text/text_pair form, where a misspelt field would be lost).
    A file that cannot be read to its end (truncated, not what its suffix says, corrupt pages) is
    an InputError naming it: never a shorter corpus."""
    try:
        if fmt.format == "parquet":
            yield from parquet_chunks(path, columns, start.row)
        elif fmt.format == "csv" or (fmt.format == "tsv" and "text" in columns):
            yield from csv_chunks(path, fmt, columns, start.row, encoding_errors)
        else:
            yield from line_chunks(path, fmt, columns, encoding_errors, start, strict_fields)
    except LayerwiseError:
        raise
    except Exception as exc:
        if not _is_damage(exc):
            raise
        raise InputError(_damage_message(path, fmt, exc)) from None


def _is_damage(exc: BaseException) -> bool:
    """A read error that says the file itself is damaged or of another kind."""
    import lzma
    import zlib

    if isinstance(exc, EOFError | OSError | lzma.LZMAError | zlib.error):
        return True
    kind = type(exc)
    return kind.__module__.startswith(("pyarrow", "zstd")) or kind.__name__ in ("ZstdError", "ArrowInvalid")


def _damage_message(path: Path, fmt: FileFormat, exc: BaseException) -> str:
    import gzip

    what = f"{fmt.compression}-compressed " if fmt.compression else ""
    if isinstance(exc, EOFError):
        return (
            f"{path}: the {what}file ends in the middle of its data (truncated: an interrupted download "
            "or copy?); nothing was written. Fetch or copy the file again"
        )
    if isinstance(exc, gzip.BadGzipFile):
        return f"{path} is not a gzip file ({exc}); decompress it or rename it to what it is"
    return f"{path} cannot be read as a {what}{fmt.format} file ({exc}); nothing was written. Check the file"
