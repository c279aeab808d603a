"""The layerwise store: a folder (``corpus.lw``) that zarr, pyarrow and DuckDB can read.

    corpus.lw/
      zarr.json                 Zarr v3 group; attribute "layerwise" holds the metadata below
      data/                     Zarr v3 array, row-major per stored text:
                                  token level     (n_tokens, n_layers, hidden)
                                  word level      (n_words, n_layers, dim)
                                  sentence level  (n_texts, n_layers, hidden)
                                  with a fusion   (n_rows, dim)
                                float16 by default, chunks of 128 rows, shards of 64 chunks
      offsets/                  Zarr v3 int64 array, fill value -1: offsets[p] is the first row of
                                the p-th stored text, offsets[p + 1] one past its last. Written after
                                the rows it covers: it is the commit marker. A reader trusts the
                                prefix up to the first -1.
      positions/                Zarr v3 int64 array, fill value -1: positions[text_id] is the text's
                                store position, written with its manifest part, before the commit
                                marker; trusted only below the committed count (and checked against
                                the manifest row it points to). Lets a reader find one text without
                                reading every manifest part. Stores without it still open.
      manifest/part-*.parquet   one row per stored text: text_id (input line order), position
                                (store order), text, text_pair, text_sha1, start, n_rows, crc32 (of
                                the text's rows, as stored), truncated, and per level: tokens,
                                char_start, char_end, word_ids, segment_ids | words, char_start,
                                char_end, segment_ids, words_lost
      .lock                     held (flock) by the one process that writes; never removed

A folder is a layerwise store when its ``zarr.json`` carries the "layerwise" attribute with
``format == "layerwise-store"``; the attribute is written with the group, before anything else.
Only such a folder is ever written into, and ``overwrite`` removes only the entries above (other
files beside them are left alone).

Texts are stored block by block (``block_size`` input texts), longest first within a block, the
order extraction runs in; ``text_id`` maps back to input order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import NotAStoreError, OptionError, StoreDamagedError, StoreError

FORMAT = "layerwise-store"
FORMAT_VERSION = 1
DATA = "data"
OFFSETS = "offsets"
POSITIONS = "positions"
MANIFEST = "manifest"
LOCK = ".lock"
ATTRIBUTE = "layerwise"
CHUNK_ROWS = 128
SHARD_CHUNKS = 64
OFFSETS_CHUNK = 4096
BLOCK_SIZE = 2048
# what a layout may ask for: each bound is what one unit costs past it (StoreLayout, --help)
MAX_CHUNK_BYTES = 64 * 2**20
MAX_SHARD_BYTES = 2 * 2**30
LAYOUT_LIMITS = {
    "block_size": (1 << 20, "a block's texts are tokenised and sorted in memory together"),
    "chunk_rows": (1 << 16, "a chunk is read whole for one row, and written whole, padded"),
    "shard_chunks": (1 << 14, "zarr indexes a shard's chunks in one table built in Python"),
}


@dataclass(frozen=True)
class StoreLayout:
    """How a store lays out its rows: ``block_size`` texts sorted and committed together,
    ``chunk_rows`` rows per chunk, ``shard_chunks`` chunks per shard (one file). Part of what a
    store resumes by."""

    block_size: int = BLOCK_SIZE
    chunk_rows: int = CHUNK_ROWS
    shard_chunks: int = SHARD_CHUNKS

    def __post_init__(self) -> None:
        for name, value in dataclasses.asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise OptionError(f"{name}={value!r} must be a whole number >= 1")
            if value > LAYOUT_LIMITS[name][0]:
                raise OptionError(
                    f"{name}={value:,} is past its bound, {LAYOUT_LIMITS[name][0]:,}: "
                    f"{LAYOUT_LIMITS[name][1]}"
                )

    def check_cost(self, row_bytes: int) -> None:
        """Refuse a chunk or shard too large for rows of ``row_bytes`` (say the bound and the largest
        value that fits): zarr writes the last shard whole, padded, even for three texts, and the
        writer holds a shard in memory while it fills."""
        chunk = self.chunk_rows * row_bytes
        if chunk > MAX_CHUNK_BYTES:
            raise OptionError(
                f"chunk_rows={self.chunk_rows:,} makes a chunk of {chunk / 2**20:,.0f} MiB "
                f"({row_bytes:,} bytes a row), past its bound of {MAX_CHUNK_BYTES // 2**20} MiB: a chunk is "
                "written whole, padded, however few texts fill it. Use --chunk-rows "
                f"{MAX_CHUNK_BYTES // row_bytes:,} or fewer "
                f"(default {CHUNK_ROWS})"
            )
        shard = chunk * self.shard_chunks
        if shard > MAX_SHARD_BYTES:
            raise OptionError(
                f"shard_chunks={self.shard_chunks:,} chunks of {self.chunk_rows:,} rows make a shard of "
                f"{shard / 2**20:,.0f} MiB, past its bound of {MAX_SHARD_BYTES // 2**20:,} MiB: the writer "
                "holds a shard in memory, and writes the last one whole. Use --shard-chunks "
                f"{MAX_SHARD_BYTES // chunk:,} or fewer (default {SHARD_CHUNKS})"
            )


# The store's own entries, in the order overwrite removes them: the commit marker first (so that a
# crash half way leaves a store with nothing committed), the group metadata last.
OWN_ENTRIES = (OFFSETS, POSITIONS, MANIFEST, DATA, "zarr.json")

# The metadata's own checksum: SHA-256 of the rest of the record as canonical JSON. A record that
# was edited (a layer list reordered, a model renamed) or hit by a flipped byte no longer matches.
SEAL = "meta_sha256"

StoreKind = Literal["missing", "empty", "store", "other"]


def record_digest(record: dict) -> str:
    """SHA-256 of ``record`` without its seal, as canonical JSON (sorted keys, no spaces)."""
    body = {k: v for k, v in record.items() if k != SEAL}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sealed(record: dict) -> dict:
    """``record`` with its seal (:data:`SEAL`), as every store and cache writes its metadata."""
    return {**{k: v for k, v in record.items() if k != SEAL}, SEAL: record_digest(record)}


def seal_problem(record: dict, what: str, *, required: bool | None = None) -> str | None:
    """Why ``record`` cannot be trusted, or None. Records written before 0.3 carry no seal; one that
    must carry it (``required``; None: when its ``layerwise_version`` is 0.3 or later) and lost it
    (a flipped byte in its key, the key removed) is refused too."""
    if SEAL not in record:
        if required is None:
            required = written_sealed(record.get("layerwise_version"))
        return f"{what} has lost its {SEAL} (every record of its version carries one)" if required else None
    if record[SEAL] != record_digest(record):
        return f"{what} differs from what was written (its {SEAL} does not match its content)"
    return None


def written_sealed(version: object) -> bool:
    """Whether layerwise ``version`` (a record's ``layerwise_version``) seals what it writes: 0.3 and
    later; anything that is not a version string, too (a damaged field is no reason to trust)."""
    numbers = re.findall(r"\d+", version) if isinstance(version, str) else []
    return len(numbers) < 2 or (int(numbers[0]), int(numbers[1])) >= (0, 3)


def damaged(path: Path, problems: list[str], text_ids: list[int], what: str = "store") -> StoreDamagedError:
    """The error for damage found in the ``what`` ("store", "sharded store", "cache") at ``path``."""
    hit = (
        f" Texts affected: {', '.join(map(str, text_ids[:10]))}{' …' if len(text_ids) > 10 else ''}."
        if text_ids
        else ""
    )
    return StoreDamagedError(
        f"{what} {str(path)!r} is damaged: {'; '.join(problems)}.{hit} Its numbers cannot be trusted: "
        f"run 'layerwise verify {path}' for the full list, then rewrite it with --overwrite "
        "(Python: overwrite=True)",
        problems=problems,
        text_ids=text_ids,
    )


def _has_store_entries(path: Path) -> bool:
    """The folder holds a store's arrays and manifest: a zarr.json that does not say so was damaged."""
    return all((path / name).is_dir() for name in (DATA, OFFSETS, MANIFEST))


def read_store_meta(path: Path) -> dict | None:
    """The "layerwise" attribute of ``path/zarr.json`` when that is a layerwise store, else None.
    Raises StoreDamagedError when the folder holds a store's entries but its metadata cannot be
    read or was changed since it was written (its seal): damage, not another kind of folder."""
    problem = None
    try:
        with open(path / "zarr.json", encoding="utf-8") as handle:
            document = json.load(handle)
    except FileNotFoundError:  # damage only where the folder holds the rest of a store
        document, problem = None, "zarr.json, the store's metadata, is missing"
    except (OSError, ValueError) as exc:
        document, problem = None, f"zarr.json cannot be read ({type(exc).__name__}: {exc})"
    attributes = document.get("attributes") if isinstance(document, dict) else None
    meta = attributes.get(ATTRIBUTE) if isinstance(attributes, dict) else None  # any other shape: none
    if isinstance(meta, dict) and meta.get("format") == FORMAT:
        problem = seal_problem(meta, f"the store's metadata (zarr.json attribute {ATTRIBUTE!r})")
        problem = problem or meta_layers_problem(meta)
        if problem is None:
            return meta
    if not _has_store_entries(path):
        return None
    raise damaged(
        path,
        [
            problem
            or f"zarr.json has no layerwise metadata, but the folder holds a store's {DATA}/, "
            f"{OFFSETS}/ and {MANIFEST}/"
        ],
        [],
    )


def meta_layers_problem(meta: dict) -> str | None:
    """The metadata's ``layers`` must be hidden-state indices, ascending, each once, below its
    ``n_hidden_states``: the checks that hold for stores written before the seal, too."""
    layers, n = meta.get("layers"), meta.get("n_hidden_states")
    if not isinstance(layers, list) or not all(type(i) is int for i in layers):
        return f"the metadata's layers {layers!r} are not a list of hidden-state indices"
    if any(b <= a for a, b in itertools.pairwise(layers)):
        return f"the metadata's layers {layers} are not ascending, each once"
    if layers and (layers[0] < 0 or (isinstance(n, int) and layers[-1] >= n)):
        return f"the metadata's layers {layers} are outside 0..{n - 1 if isinstance(n, int) else '?'}"
    shape = meta.get("row_shape")
    if meta.get("fuse") is None and isinstance(shape, list) and len(shape) == 2 and shape[0] != len(layers):
        return f"the metadata's layers {layers} are {len(layers)}, its rows hold {shape[0]} hidden states"
    return None


def classify(path: Path) -> StoreKind:
    """What is at ``path``: nothing, an empty folder (or one holding only a lock file), a layerwise
    store, or something else (which layerwise never writes into)."""
    kind = folder_kind(path, "a store", lambda p: read_store_meta(p) is not None)
    return "store" if kind == "ours" else kind  # type: ignore[return-value]


def folder_kind(path: Path, what: str, is_ours) -> str:
    """One of "missing", "empty" (nothing, or only a lock file), "ours" (``is_ours(path)``) or "other",
    for a folder layerwise writes (``what``: "a store", "a cache"); a file there is an error."""
    if not path.exists() and not path.is_symlink():
        return "missing"
    if not path.is_dir():
        raise NotAStoreError(f"{str(path)!r} exists and is a file; {what} is a folder: choose another path")
    if set(os.listdir(path)) <= {LOCK}:
        return "empty"
    return "ours" if is_ours(path) else "other"


def not_a_store(path: Path, reading: bool = False) -> NotAStoreError:
    """The error for a folder that is not a store: a writer will not touch it; a reader (``reading``)
    says what it needs, and names an activation cache as one."""
    what = f"{str(path)!r} is a folder that is not a layerwise store (no zarr.json with layerwise metadata)"
    if not reading:
        return NotAStoreError(
            f"{what}; layerwise will not write into it or remove anything from it: choose another path"
        )
    if (path / "layerwise-cache.json").exists():
        return NotAStoreError(
            f"{str(path)!r} is a layerwise activation cache, not a store: verify checks it; read it with "
            "lw.load_cache (a datasets folder). export and open_store read stores (layerwise extract -o X.lw)"
        )
    if path.is_dir() and not any(path.iterdir()):
        return NotAStoreError(
            f"{str(path)!r} is an empty folder, not a layerwise store: give a store folder "
            "(layerwise extract INPUT -o corpus.lw writes one)"
        )
    return NotAStoreError(f"{what}: give a store folder (layerwise extract INPUT -o corpus.lw writes one)")


def remove_store_entries(path: Path) -> None:
    """Delete the store's own entries (never the lock, never anything else in the folder)."""
    for name in OWN_ENTRIES:
        entry = path / name
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
        except OSError as exc:
            raise StoreError(f"cannot remove {str(entry)!r}: {exc.strerror}") from exc


def require_store_dependencies() -> None:
    """zarr and pyarrow are an extra: say how to install them when they are missing."""
    from .._settings.extras import require

    require("store")
