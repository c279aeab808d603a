"""Where a corpus comes from: files named, globbed or in a folder, standard input, their format;
and the checks on each row's values (corpus.py reads and counts, this module judges)."""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..errors import InputError, OptionError
from .formats import FileFormat, detect_format
from .raw import lone_surrogate

logger = logging.getLogger("layerwise")


def find_files(source, given_format: str | None) -> tuple[list[Path], Path | None]:
    """The files a source names, and the spool file that holds standard input, if it is one."""
    spool: Path | None = None
    sources = [source] if isinstance(source, str | os.PathLike) else list(source)
    if not sources:
        raise InputError("no input files given")
    files: list[Path] = []
    for item in sources:
        name = os.fspath(item)
        if name == "-":
            if spool is not None:
                raise OptionError("standard input (-) can be read once per run")
            spool = spool_stdin(given_format)
            files.append(spool)
        elif glob.has_magic(name) and not Path(name).exists():
            found = sorted(Path(p) for p in glob.glob(name, recursive=True) if Path(p).is_file())
            found = _without_outputs(found, name)
            if not found:
                raise InputError(f"no file matches {name!r}")
            files.extend(found)
        elif Path(name).is_dir():
            # hidden files (a writer's temporary files among them) and markers such as Spark's
            # _SUCCESS are not part of the data
            found = sorted(p for p in Path(name).iterdir() if p.is_file() and p.name[0] not in "._")
            found = _without_outputs(found, name)
            if not found:
                raise InputError(f"the folder {name!r} holds no files")
            files.extend(found)
        elif not Path(name).exists():
            detect_format(Path(name), given_format)  # a refused kind (.json, .zip) says so first
            raise InputError(f"input file {name!r} does not exist")
        else:
            files.append(Path(name))
    return files, spool


def _without_outputs(found: list[Path], pattern: str) -> list[Path]:
    """The files a glob or a folder matched, less layerwise's own outputs (an earlier run's
    vectors written next to the corpus would be read as texts, and a rerun would read its own
    output): said once, naming them. A file named on its own is always read."""
    outputs = [path for path in found if is_layerwise_output(path)]
    if outputs:
        named = ", ".join(str(p) for p in outputs[:3]) + (" …" if len(outputs) > 3 else "")
        logger.warning(
            "left out %d layerwise output(s) that %r matches: %s; name a file on its own to read it",
            len(outputs),
            pattern,
            named,
        )
    return [path for path in found if path not in outputs]


def is_layerwise_output(path: Path) -> bool:
    """Whether ``path`` is a .parquet or .jsonl file that layerwise wrote (its metadata says so)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return b"layerwise" in (pq.read_schema(path).metadata or {})
        if suffix == ".jsonl":
            with open(path, "rb") as handle:
                first = handle.readline(1 << 20)
            return first.startswith(b"{") and b'"layerwise": {' in first
    except Exception:  # not readable as such: the reader reports it, naming the file
        return False
    return False


def spool_stdin(given_format: str | None) -> Path:
    """Standard input, copied to a temporary file (removed with this object): a corpus is read
    twice (scan, then extract), and Parquet needs to seek."""
    if given_format is None:
        given_format = "txt"  # one text per line
    handle, name = tempfile.mkstemp(prefix="layerwise-stdin-", suffix=f".{given_format}")
    with os.fdopen(handle, "wb") as out:
        shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)
    return Path(name)


def one_format(files: list[Path], given: str | None, spool: Path | None) -> FileFormat:
    """The one format of ``files`` (compression may differ from file to file: "per-file")."""
    formats = {detect_format(Path(f"stdin.{given}") if p == spool else p, given) for p in files}
    kinds = {f.format for f in formats}
    if len(kinds) > 1:
        listed = ", ".join(f"{p.name}: {detect_format(p, given).format}" for p in files[:6])
        raise InputError(f"the input files are of different formats ({listed}); pass files of one format")
    if len(formats) > 1:  # the same format, some compressed: each file is opened by its own suffix
        return FileFormat(kinds.pop(), "per-file")
    return formats.pop()


def column_roles(fmt: str, text, pair, ids, words) -> dict[str, str]:
    """Role (text, pair, id, words) -> the column or field that holds it, for a format."""
    named = {r: n for r, n in (("text", text), ("pair", pair), ("id", ids), ("words", words)) if n}
    if fmt == "txt" and named:
        raise OptionError(
            f"a .txt input has no columns (one text per line): drop --{next(iter(named))}-column, or "
            "read a table (.csv, .tsv with a header, .parquet, .jsonl)"
        )
    if fmt == "tsv" and named and "text" not in named:
        raise OptionError(
            "a .tsv without --text-column is read as pairs (two columns, no header); with a header "
            "row, name the columns: --text-column (and --pair-column, --id-column)"
        )
    if fmt == "jsonl" and not named:
        return {"text": "text", "pair": "text_pair"}
    if fmt in ("csv", "parquet", "jsonl") and "text" not in named and "words" not in named:
        named["text"] = "text"  # a table's text is in its "text" column unless --text-column says
    return named


def remove_file(name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name)


def hash_into(digests: tuple, text: str, pair: str | None) -> None:
    """The same bytes as shard_table.texts_sha256: a text, NUL, (its pair, NUL)."""
    data = text.encode("utf-8", "surrogatepass") + b"\x00"
    if pair is not None:
        data += pair.encode("utf-8", "surrogatepass") + b"\x00"
    for digest in digests:
        digest.update(data)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def row_problem(role: str, value: object) -> str | None:
    """Why ``value`` cannot be the row's ``role`` (text, pair, words, id), or None."""
    if value is None:
        return {
            "text": "null (an empty cell or a missing value) where a text is needed",
            "pair": "null beside a text: a pair needs both segments",
            "words": "null where a list of words is needed",
            "id": "a null id: every row needs one to be found again",
        }[role]
    if role == "id":
        if is_int(value) and not -(2**63) <= value < 2**63:  # type: ignore[operator]
            # every output keeps integer ids as int64 (.npz, Parquet, the store's manifest)
            return (
                f"an id of {value}, past what a 64-bit integer holds (-2**63 … 2**63-1); make the ids "
                "strings (cast the column to string) or number the rows"
            )
        return (
            None
            if isinstance(value, int | str) and not isinstance(value, bool)
            else (f"an id of type {type(value).__name__} ({value!r:.40}); ids are integers or strings")
        )
    if role == "words":
        if isinstance(value, str) or not isinstance(value, list):
            return f"{type(value).__name__} ({value!r:.40}), not a list of words"
        for j, word in enumerate(value):
            if not isinstance(word, str) or not word:
                return f"word {j} is {word!r:.40}: each word must be a non-empty string"
            if lone_surrogate(word) is not None:
                return f"word {j} holds a lone surrogate, which is not valid Unicode"
        return None
    if not isinstance(value, str):
        return f"{type(value).__name__} ({value!r:.40}), not a text"
    position = lone_surrogate(value)
    if position is not None:
        return (
            f"holds the lone surrogate U+{ord(value[position]):04X} at character {position} (an escape "
            "such as \\ud800 without its pair), which is not valid Unicode"
        )
    return None


def check_ids(ids: Sequence, n: int) -> list:
    ids = list(ids)
    if len(ids) != n:
        raise InputError(f"{n} texts but {len(ids)} ids; pass one id per text")
    for i, ident in enumerate(ids):
        problem = row_problem("id", ident)
        if problem:
            raise InputError(f"ids[{i}]: {problem}", index=i)
    return ids
