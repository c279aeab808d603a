"""Reading probing data sets: CoNLL-U, CoNLL-2003 columns, TSV/CSV sentences, sentence pairs.

Each reader returns plain lists so that probing can be tested on hand-made data.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

CONLLU_COLUMNS = {"form": 1, "lemma": 2, "upos": 3, "xpos": 4, "feats": 5, "head": 6, "deprel": 7}


@dataclass(frozen=True)
class TaggedSentences:
    """Sentences as word lists with one label per word."""

    words: list[list[str]]
    labels: list[list[str]]

    def __len__(self) -> int:
        return len(self.words)

    def head(self, n: int | None) -> TaggedSentences:
        return self if n is None else TaggedSentences(self.words[:n], self.labels[:n])


def _text_lines(path: Path, what: str) -> list[str]:
    """The lines of a UTF-8 file (a leading byte-order mark dropped); invalid UTF-8 names its line."""
    from .._inputs.readers import read_lines

    if path.is_dir():
        raise InputError(f"{what} {str(path)!r} is a folder")
    return read_lines(path, what=what, option_hint=False)


def _none_found(path: Path, what: str) -> InputError:
    return InputError(f"{path}: no {what} found; is the file empty or in another format?")


def read_conllu(path: str | os.PathLike, column: str = "upos") -> TaggedSentences:
    """Words and one column of a CoNLL-U file; multi-word token lines (1-2) and empty nodes (1.1)
    are skipped so that words match the syntactic words the labels belong to."""
    if column not in CONLLU_COLUMNS:
        raise InputError(
            f"column {column!r} is not a CoNLL-U column; choose one of {', '.join(CONLLU_COLUMNS)}"
        )
    index = CONLLU_COLUMNS[column]
    words: list[list[str]] = []
    labels: list[list[str]] = []
    current_words: list[str] = []
    current_labels: list[str] = []
    path = Path(path)
    for number, line in enumerate(_text_lines(path, "CoNLL-U file"), start=1):
        if not line.strip():
            if current_words:
                words.append(current_words)
                labels.append(current_labels)
            current_words, current_labels = [], []
            continue
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 10:
            raise InputError(f"{path}: line {number} has {len(fields)} columns; CoNLL-U has 10", line=number)
        if "-" in fields[0] or "." in fields[0]:
            continue
        current_words.append(fields[1])
        current_labels.append(fields[index])
    if current_words:
        words.append(current_words)
        labels.append(current_labels)
    if not words:
        raise _none_found(path, "CoNLL-U sentences")
    return TaggedSentences(words, labels)


def read_conll2003(path: str | os.PathLike, column: str = "ner") -> TaggedSentences:
    """CoNLL-2003 style: 'word POS chunk NER' per line, blank lines between sentences,
    -DOCSTART- lines skipped. ``column``: ner (last), pos (2nd) or chunk (3rd)."""
    positions = {"pos": 1, "chunk": 2, "ner": -1}
    if column not in positions:
        raise InputError(f"column {column!r} is not valid for CoNLL-2003; choose one of ner, pos, chunk")
    words: list[list[str]] = []
    labels: list[list[str]] = []
    cw: list[str] = []
    cl: list[str] = []
    path = Path(path)
    width = first = 0  # every token line has the columns of the first: a plain sentence does not
    for number, line in enumerate(_text_lines(path, "CoNLL file"), start=1):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if cw:
                words.append(cw)
                labels.append(cl)
            cw, cl = [], []
            continue
        if not width:
            width, first = len(fields), number
            if not 2 <= width <= 4 or (column != "ner" and width != 4):
                raise _not_conll(path, number, width, column)
        if len(fields) != width:
            raise InputError(
                f"{path}: line {number} has {len(fields)} columns, line {first} has {width}: a CoNLL file "
                "has one token per line (word POS chunk NER, or word and label), blank lines between texts",
                line=number,
            )
        cw.append(fields[0])
        cl.append(fields[positions[column]])
    if cw:
        words.append(cw)
        labels.append(cl)
    if not words:
        raise _none_found(path, "CoNLL sentences")
    return TaggedSentences(words, labels)


def _not_conll(path: Path, number: int, width: int, column: str) -> InputError:
    wanted = "4 (word POS chunk NER)" if column != "ner" else "2 to 4 (word ... NER)"
    return InputError(
        f"{path}: line {number} has {width} columns; CoNLL-2003 has {wanted}, one token per line and a "
        "blank line between sentences. Is it plain text? Tag it first, or give a CoNLL file",
        line=number,
    )


def require_classes(labels: list[str] | set[str], what: str) -> None:
    """Refuse a task whose training labels hold one class: every layer would score 100 % (a probe
    that always says it), and a ranking of them would be noise presented as a finding."""
    classes = sorted(set(labels))
    if len(classes) < 2:
        raise InputError(
            f"the training {what} hold one class ({classes[0]!r} only, if any): every layer would score "
            "100 and no layer could be ranked. Give training data with at least two classes (is the column "
            "right?)"
            if classes
            else f"the training {what} are empty"
        )


def _dialect(path: Path) -> str:
    return "excel-tab" if path.suffix.lower() in (".tsv", ".tab") else "excel"


def read_table(path: str | os.PathLike, columns: list[str]) -> dict[str, list[str]]:
    """Named columns of a TSV (.tsv) or CSV file with a header row."""
    path = Path(path)
    lines = _text_lines(path, "file")
    reader = csv.DictReader(lines, dialect=_dialect(path))
    header = reader.fieldnames or []
    missing = [c for c in columns if c not in header]
    if missing:
        raise InputError(f"{path}: no column(s) {missing}; the header has {header}")
    out: dict[str, list[str]] = {c: [] for c in columns}
    for row in reader:
        for c in columns:
            value = row[c]
            if value is None:  # the row has fewer fields than the header
                number = reader.line_num
                raise InputError(
                    f"{path}: line {number} has no value for column {c!r} (it has {len(header)} columns "
                    f"in the header, fewer on this line)",
                    line=number,
                )
            out[c].append(value)
    if not out[columns[0]]:
        raise _none_found(path, "rows below the header")
    return out


def bio_spans(tags: list[str]) -> set[tuple[str, int, int]]:
    """Entity spans ``(type, start, end)`` (end exclusive) from BIO tags, IOB1 or IOB2, with
    conlleval's rules: an entity starts at B-X, or at I-X after O or after another type; it
    continues while the tags are I-X."""
    spans = set()
    kind, start = None, 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, label = tag.partition("-")
        starts = prefix == "B" or (prefix == "I" and label != kind) or prefix not in ("B", "I")
        if kind is not None and starts:
            spans.add((kind, start, i))
            kind = None
        if prefix in ("B", "I") and starts:
            kind, start = label, i
    return spans


def entity_f1(gold: list[list[str]], predicted: list[list[str]]) -> float:
    """Micro entity-level F1 over sentences (exact span and type), as conlleval reports it."""
    tp = n_gold = n_pred = 0
    for g, p in zip(gold, predicted, strict=True):
        gs, ps = bio_spans(g), bio_spans(p)
        tp += len(gs & ps)
        n_gold += len(gs)
        n_pred += len(ps)
    if tp == 0:
        return 0.0
    precision, recall = tp / n_pred, tp / n_gold
    return 2 * precision * recall / (precision + recall)
