"""Input files for the command line: one text per line, TSV pairs, or JSONL.

    .txt (or anything else)   one text per line; blank lines are kept as empty texts so that
                              result i always belongs to line i + 1
    .tsv                      two tab-separated columns per line: first and second segment
    .jsonl / .ndjson          one object per line: {"text": ..., "text_pair": ... (optional)}

Errors name the file, the line and the fix. Invalid UTF-8 is an error unless the caller asks for
replacement characters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, check_choice
from .formats import ENCODING_ERRORS, EncodingErrors
from .raw import lone_surrogate


@dataclass(frozen=True)
class InputFile:
    """Texts read from a file; ``lines[i]`` is the 1-based line that text ``i`` came from."""

    path: Path
    texts: list[str]
    text_pairs: list[str] | None
    lines: list[int]

    def __len__(self) -> int:
        return len(self.texts)


def read_lines(
    path: Path, errors: EncodingErrors = "strict", *, what: str = "input file", option_hint: bool = True
) -> list[str]:
    """The lines of a UTF-8 file, without line ends and a leading byte-order mark; invalid UTF-8 is
    an error naming the line (``option_hint``: suggest ``--encoding-errors replace``, for commands
    that have it)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{what} {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"input {str(path)!r} is a folder; pass a .txt, .tsv or .jsonl file") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the last line does not start another
    if data.startswith(b"\xef\xbb\xbf"):
        lines[0] = lines[0][3:]  # UTF-8 byte-order mark
    decoded = []
    for number, raw in enumerate(lines, start=1):
        raw = raw.removesuffix(b"\r")
        try:
            decoded.append(raw.decode("utf-8", errors=errors))
        except UnicodeDecodeError as exc:
            raise InputError(
                f"{path}: line {number} is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte "
                f"{exc.start + 1} of the line); re-encode the file, e.g. "
                f"'iconv -f latin1 -t utf-8 {path.name} > fixed.txt'"
                + (", or pass --encoding-errors replace" if option_hint else ""),
                line=number,
            ) from None
    return decoded


_UNSUPPORTED = {
    ".json": "one JSON document",
    ".csv": "a table (use .tsv for pairs)",
    ".gz": "compressed text (decompress it first)",
    ".zip": "an archive",
    ".parquet": "a table",
}


JSONL_FIELDS = frozenset({"text", "text_pair"})


def read_input_file(path: str | Path, *, encoding_errors: EncodingErrors = "strict") -> InputFile:
    """Read texts (and pairs) from ``path``; the format follows the suffix."""
    check_choice("encoding_errors", encoding_errors, ENCODING_ERRORS)
    path = Path(path)
    suffix = path.suffix.lower()
    if str(path) == "-":
        raise InputError("reading from standard input is not supported; save the texts to a .txt file")
    if suffix in _UNSUPPORTED:
        raise InputError(
            f"{str(path)!r}: {suffix} files are not read as {_UNSUPPORTED[suffix]}; layerwise reads "
            '.txt (one text per line), .tsv (two columns: a pair) and .jsonl ({"text": ...} per line)'
        )
    lines = read_lines(path, encoding_errors)
    if suffix in (".jsonl", ".ndjson"):
        return _read_jsonl(path, lines)
    if suffix == ".tsv":
        return _read_tsv(path, lines)
    return InputFile(path, lines, None, list(range(1, len(lines) + 1)))


def _read_tsv(path: Path, lines: list[str]) -> InputFile:
    firsts, seconds, numbers = [], [], []
    for number, line in enumerate(lines, start=1):
        if not line:
            continue  # an empty line separates nothing: skipped, as in JSON Lines
        if not line.strip():
            raise InputError(
                f"{path}: line {number} holds only whitespace ({line!r}); a .tsv line is a pair of texts: "
                "remove the line, or write the texts",
                line=number,
            )
        columns = line.split("\t")
        if len(columns) != 2:
            raise InputError(
                f"{path}: line {number} has {len(columns)} tab-separated column(s); a .tsv input needs "
                "exactly two (first segment, second segment). Use a .txt file for single texts.",
                line=number,
            )
        firsts.append(columns[0])
        seconds.append(columns[1])
        numbers.append(number)
    return InputFile(path, firsts, seconds, numbers)


def _read_jsonl(path: Path, lines: list[str]) -> InputFile:
    texts, pairs, numbers = [], [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: line {number} is not valid JSON ({exc.msg})", line=number) from None
        except RecursionError:
            raise InputError(
                f"{path}: line {number} is nested too deeply to be a text record", line=number
            ) from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise InputError(
                f'{path}: line {number} needs an object with a string "text" field, e.g. '
                '{"text": "The bank raised rates."}',
                line=number,
            )
        unknown = sorted(set(record) - JSONL_FIELDS)
        if unknown:  # a misspelled "text_pair" would silently leave the text unpaired
            raise InputError(
                f"{path}: line {number} has the field(s) {', '.join(map(repr, unknown))}; a .jsonl input "
                f"line holds {' and '.join(map(repr, sorted(JSONL_FIELDS)))} only",
                line=number,
            )
        pair = record.get("text_pair")
        if pair is not None and not isinstance(pair, str):
            raise InputError(f'{path}: line {number}: "text_pair" must be a string', line=number)
        for field_name, value in (("text", record["text"]), ("text_pair", pair)):
            if value is not None and (position := lone_surrogate(value)) is not None:
                raise InputError(
                    f'{path}: line {number}: "{field_name}" holds the lone surrogate '
                    f"U+{ord(value[position]):04X} (an escape such as \\ud800 without its pair); "
                    "repair the file",
                    line=number,
                )
        texts.append(record["text"])
        pairs.append(pair)
        numbers.append(number)
    with_pair = [p is not None for p in pairs]
    if any(with_pair) and not all(with_pair):
        odd = numbers[with_pair.index(not with_pair[0])]
        raise InputError(
            f'{path}: line {odd}: either every line has a "text_pair" or none does '
            f"(line {numbers[0]} {'has' if with_pair[0] else 'has not'}); split the file in two",
            line=odd,
        )
    seconds = [p or "" for p in pairs] if pairs and all(with_pair) else None
    return InputFile(path, texts, seconds, numbers)
