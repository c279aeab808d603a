"""What one pass over a corpus finds (``Corpus.scan``): its texts and skipped rows counted, its ids'
type, where each range of texts starts (so that a reader, a Ray actor, can begin there) and the
SHA-256 of every range and of the whole (resuming and sharding compare them)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from .formats import Start
from .raw import RawInputs
from .sources import hash_into, is_int


@dataclass
class Scan:
    """What one pass over a corpus found."""

    n_texts: int = 0
    n_skipped: int = 0
    skipped: list[str] = field(default_factory=list)  # the first corpus.SKIPPED_SHOWN reasons
    has_pairs: bool = False
    id_kind: str = "int"  # "int" or "str": every id is an int, or every id is written as a string
    pairs_decided: bool = False
    # text -> (file index, where the text's row starts, global row of that file's row 0)
    starts: dict[int, tuple[int, Start, int]] = field(default_factory=dict)
    range_hashes: list[str] = field(default_factory=list)  # SHA-256 of each range of texts asked for
    # the same for every range size asked for at once (one pass plans shards of any of them)
    hashes_by_size: dict[int, list[str]] = field(default_factory=dict)
    sha256: str = ""  # of all texts (and pairs), in order


def scan_rows(scan: Scan, rows: Iterator[tuple], sizes: tuple[int, ...], limit: int | None) -> None:
    """:meth:`Corpus.scan`'s pass over a file corpus' good rows."""
    whole = hashlib.sha256()
    parts = {size: hashlib.sha256() for size in sizes}
    id_kinds: set[str] = set()
    for _, text, pair, _, ident, origin in rows:
        if not scan.pairs_decided:  # the first good row decides: from here on, every row agrees
            scan.has_pairs, scan.pairs_decided = pair is not None, True
        hashes = [whole]
        for size, part in parts.items():
            if scan.n_texts % size == 0:
                if scan.n_texts:
                    scan.hashes_by_size.setdefault(size, []).append(part.hexdigest())
                    part = parts[size] = hashlib.sha256()
                scan.starts[scan.n_texts] = origin
            hashes.append(part)
        hash_into(tuple(hashes), text, pair if scan.has_pairs else None)
        id_kinds.add("int" if ident is None or is_int(ident) else "str")
        scan.n_texts += 1
        if limit is not None and scan.n_texts >= limit:
            break
    for size, part in parts.items():
        scan.hashes_by_size.setdefault(size, [])
        if scan.n_texts:
            scan.hashes_by_size[size].append(part.hexdigest())
    scan.id_kind = "str" if "str" in id_kinds else "int"
    scan.sha256 = whole.hexdigest()


def range_sizes(ranges: int | Sequence[int] | None) -> tuple[int, ...]:
    """The sizes of the ranges of texts a scan hashes (each once, in the order asked)."""
    if ranges is None:
        return ()
    return (ranges,) if isinstance(ranges, int) else tuple(dict.fromkeys(ranges))


def pick_ranges(scan: Scan, sizes: tuple[int, ...]) -> None:
    """``range_hashes``: the hashes of the one size asked for (of several, none is picked)."""
    if len(sizes) == 1:
        scan.range_hashes = scan.hashes_by_size[sizes[0]]


def scan_memory(scan: Scan, raw: RawInputs, ids: list | None, sizes: tuple[int, ...]) -> None:
    """:meth:`Corpus.scan` of texts in memory: the same counts and hashes as a file's pass."""
    scan.n_texts, scan.has_pairs = len(raw), raw.text_pairs is not None
    scan.id_kind = "int" if ids is None or all(is_int(i) for i in ids) else "str"
    whole = hashlib.sha256()
    for i, text in enumerate(raw.texts):
        pair = raw.text_pairs[i] if raw.text_pairs is not None else None
        hash_into((whole,), text, pair)
    scan.sha256 = whole.hexdigest()
    for size in sizes:
        hashes = scan.hashes_by_size.setdefault(size, [])
        for lo in range(0, len(raw), size):
            part = hashlib.sha256()
            for i in range(lo, min(lo + size, len(raw))):
                pair = raw.text_pairs[i] if raw.text_pairs is not None else None
                hash_into((part,), raw.texts[i], pair)
            hashes.append(part.hexdigest())
