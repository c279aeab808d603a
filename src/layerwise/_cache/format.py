"""The activation cache on disk: a Hugging Face ``datasets`` folder in SAELens' schema.

    acts/
      layerwise-cache.json          what made it (model, weights' hash, layers, context, tokens,
                                    dtype, seed, final norm, the contexts' hash) and its shards,
                                    sealed by its own SHA-256 (``meta_sha256``); written first:
                                    from then on the folder says it is a cache. Once every shard is
                                    there it also holds each shard's CRC-32 (``shard_crc32``)
      contexts.i32                  every context's token ids, int32 (n_contexts, context), in
                                    source order (before shuffling): the input of every shard
      data-00000-of-00012.arrow     Arrow IPC streams, as ``Dataset.save_to_disk`` writes them: one
      data-00001-of-00012.arrow     column per hook, ``Array2D((context, d_model), dtype)``, and
      ...                           ``token_ids`` (``int32[context]``); rows in shuffled order;
                                    each written as a hidden temp file and renamed when whole,
      .data-00000-of-00012.arrow.crc32  its CRC-32, written before the shard's rename; moved into
                                    the record when the cache is finished
      dataset_info.json, state.json written last, when every shard is there: ``load_from_disk``
                                    opens the folder from then on
      .lock                         held (flock) by the one process that writes

Hook names follow TransformerLens (what SAELens' ``hook_name`` means): hidden state ``i + 1`` (the
output of block ``i``) is ``blocks.{i}.hook_resid_post``; hidden state 0 (the embeddings, the input
of block 0) is ``blocks.0.hook_resid_pre``. These are the raw residual stream: a decoder's final
norm is not applied (``final_norm=False``, the default of the cache). With ``final_norm=True`` the
last hidden state is the final norm's output and is named ``ln_final.hook_normalized``.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Literal

from ..errors import NotAStoreError, StoreDamagedError, StoreError
from ..store._format import damaged, folder_kind, seal_problem, sealed

FORMAT = "layerwise-activation-cache"
FORMAT_VERSION = 2  # 2: the record is sealed and holds each shard's CRC-32
META = "layerwise-cache.json"
CONTEXTS = "contexts.i32"
STATE = "state.json"
INFO = "dataset_info.json"
LOCK = ".lock"
TOKEN_IDS = "token_ids"

CacheKind = Literal["missing", "empty", "cache", "other"]


def hook_name(hidden_state: int, n_layers: int, final_norm: bool) -> str:
    """The TransformerLens name of hidden state ``hidden_state`` (module docstring)."""
    if hidden_state == 0:
        return "blocks.0.hook_resid_pre"
    if hidden_state == n_layers and final_norm:
        return "ln_final.hook_normalized"
    return f"blocks.{hidden_state - 1}.hook_resid_post"


def shard_name(k: int, n_shards: int) -> str:
    return f"data-{k:05d}-of-{n_shards:05d}.arrow"


def checksum_name(shard: str) -> str:
    """The hidden file that holds a shard's CRC-32 until the record does."""
    return f".{shard}.crc32"


def cache_damaged(path: Path, problems: list[str]) -> StoreDamagedError:
    return damaged(path, problems, [], "cache")


# what a cache's folder holds besides its record: a folder with these and no record lost its record
CACHE_ENTRIES = ("contexts.i32", "state.json", "dataset_info.json")


def lost_its_record(path: Path) -> bool:
    """A folder with a cache's own files but no layerwise-cache.json: a damaged cache."""
    path = Path(path)
    return path.is_dir() and not (path / META).exists() and any((path / n).exists() for n in CACHE_ENTRIES)


def read_meta(path: Path) -> dict | None:
    """The cache's own record when ``path`` is a layerwise activation cache, else None. A record
    that cannot be read, or whose content differs from its seal, is damage (StoreDamagedError):
    its name says the folder is a cache."""
    if not Path(path).is_dir():  # a file, or nothing: not a cache (its readers say what it is)
        return None
    try:
        text = (path / META).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # not UTF-8, unreadable
        raise cache_damaged(path, [f"{META} cannot be read ({type(exc).__name__}: {exc})"]) from None
    try:
        meta = json.loads(text)
    except ValueError as exc:
        raise cache_damaged(path, [f"{META} is not JSON ({exc})"]) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise cache_damaged(path, [f"{META} is not a layerwise activation cache's record"])
    sealed_since = meta.get("format_version", 1) >= 2 if isinstance(meta.get("format_version"), int) else True
    problem = seal_problem(meta, f"the cache's record ({META})", required=sealed_since)
    if problem is not None:
        raise cache_damaged(path, [problem])
    return meta


def classify(path: Path) -> CacheKind:
    """What is at ``path``: nothing, an empty folder, a cache, or something else (never written)."""
    kind = folder_kind(path, "a cache", lambda p: read_meta(p) is not None)
    return "cache" if kind == "ours" else kind  # type: ignore[return-value]


def not_a_cache(path: Path) -> NotAStoreError:
    return NotAStoreError(
        f"{str(path)!r} is a folder that is not a layerwise activation cache (no {META}); layerwise will "
        "not write into it or remove anything from it: choose another path"
    )


def owned_entries(path: Path) -> list[Path]:
    """What the cache owns, in the order overwrite removes it (the dataset's index first, so a
    crash half way leaves no folder that load_from_disk would open; the record last)."""
    names = [STATE, INFO]
    names += sorted(n for n in os.listdir(path) if n.startswith("data-") and n.endswith(".arrow"))
    names += sorted(
        n for n in os.listdir(path) if n.startswith(".") and (n.endswith(".partial") or n.endswith(".crc32"))
    )
    names += [CONTEXTS, META]
    return [path / n for n in names]


def remove_owned(path: Path) -> None:
    for entry in owned_entries(path):
        try:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
        except OSError as exc:
            raise StoreError(f"cannot remove {str(entry)!r}: {exc.strerror}") from exc


def write_json(path: Path, document: dict, *, seal: bool = False) -> None:
    """Write ``document`` atomically; ``seal``: with its SHA-256."""
    write_text_atomically(path, json.dumps(sealed(document) if seal else document, indent=1) + "\n")


def write_text_atomically(path: Path, text: str) -> None:
    """A hidden temp file (``remove_owned`` clears one a crash left), fsync, rename; a failed write
    leaves nothing behind."""
    tmp = path.with_name(f".{path.name.lstrip('.')}.partial")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def require_cache_dependencies() -> None:
    """datasets and pyarrow are an extra: say how to install them when they are missing."""
    from .._settings.extras import require

    require("cache")


def features(columns: dict[str, int], context: int, dtype: str):
    """The ``datasets.Features`` of a cache: ``columns`` maps each hook name to its width."""
    from datasets import Array2D, Features, Sequence, Value

    schema: dict = {name: Array2D(shape=(context, width), dtype=dtype) for name, width in columns.items()}
    schema[TOKEN_IDS] = Sequence(Value("int32"), length=context)
    return Features(schema)
