"""``lw.read_meta(path)``: how any layerwise output was made, as one plain dict.

    lw.read_meta("vectors.npz")["final_norm"]       # "all"
    layerwise info corpus.lw                        # the same, printed

Every output records it when it is written (``Encoder.run_meta``): layerwise's version, the
settings the model was loaded and run with under their Python names (``model``, ``model_dtype``,
``max_length``, ``batch_size``, ``final_norm``…, with ``weights_sha256``), the plan (``layers``,
``pool``, ``fuse``, ``dtype``, ``long_texts``, ``stride``…) and the source corpus. Where it lives:

- ``.npz``: the ``meta`` array (a JSON string);
- ``.jsonl``: the ``layerwise`` object of the first line (the file stays one record per line);
- ``.parquet``: the schema's ``layerwise`` metadata;
- a store: the ``layerwise`` attribute of its ``zarr.json``;
- a sharded store: its table (``layerwise-shards.json``), with what its first shard records for
  settings a table before layerwise 0.3 did not keep;
- an activation cache: its record (``layerwise-cache.json``).

Only the metadata is read: no vectors, no texts, no model. NumPy only (pyarrow for ``.parquet``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import InputError, NotAStoreError

KINDS = {".npz": "npz", ".jsonl": "jsonl", ".parquet": "parquet"}
FORWARDS = ("packed", "streamed", "general")


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """How the output at ``path`` was made: ``{"path": the output, "kind": …, "layerwise_version": …,
    "model": …, "forward": packed, streamed or general, "final_norm": …, "layers": […], "pool": …,
    …}``. A file or folder that is not a layerwise output is an InputError naming it."""
    path = Path(path)
    if path.is_dir():
        meta = _folder_meta(path)
    elif path.is_file() and path.suffix.lower() == ".json":
        meta = _made_meta(path, "layers table")
    elif path.is_file():
        kind = KINDS.get(path.suffix.lower())
        if kind is None:
            raise InputError(
                f"{str(path)!r} is not a layerwise output: give an .npz, .jsonl, .parquet or .json file "
                "(layerwise layers --json), a store folder (*.lw), a cache or an analyze report folder"
            )
        meta = {
            "kind": kind,
            **{"npz": _npz_meta, "jsonl": _jsonl_meta, "parquet": _parquet_meta}[kind](path),
        }
    else:
        raise InputError(f"{str(path)!r} does not exist")
    if meta.get("path") in FORWARDS:  # 0.3's outputs named the forward "path": the output's own here
        meta = {("forward" if key == "path" else key): value for key, value in meta.items()}
    if "streams" in meta:  # and the concurrent forwards "streams", which reads like layer streaming
        meta = {("concurrent_forwards" if key == "streams" else key): value for key, value in meta.items()}
    return {"path": str(path), **meta}


def _made_meta(path: Path, kind: str) -> dict:
    """The ``made`` record of a JSON output (``layerwise layers --json``, an analyze report's
    stats.json): the version, the settings under their Python names, the source and the rest."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{str(path)!r} cannot be read as JSON ({exc})") from None
    made = record.get("made") if isinstance(record, dict) else None
    if not isinstance(made, dict):
        raise InputError(
            f"{str(path)!r} is JSON without a layerwise 'made' record: not a layers table or an analyze "
            "report's stats.json (reports written before layerwise 0.3 recorded only the model)"
        )
    rest = {k: v for k, v in made.items() if k not in ("layerwise", "settings")}
    settings: dict = made["settings"] if isinstance(made.get("settings"), dict) else {}
    model = {"model": record["model"]} if "model" in record else {}
    return {"kind": kind, "layerwise_version": made.get("layerwise"), **settings, **model, **rest}


def _npz_meta(path: Path) -> dict:
    import zipfile

    import numpy as np

    if not zipfile.is_zipfile(path):  # np.load would try it as a pickle and suggest unsafe loading
        raise InputError(
            f"{str(path)!r} is not an .npz that layerwise wrote (not a zip archive at all): give an output "
            "of layerwise extract -o FILE.npz"
        )
    try:
        with np.load(path, allow_pickle=False) as npz:
            if "meta" not in npz.files:
                raise InputError(f"{str(path)!r} is an .npz without layerwise metadata (no 'meta' array)")
            return _object(_json(str(npz["meta"]), path, "its 'meta' array"), path)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # EOFError: an empty file
        if isinstance(exc, InputError):
            raise
        reason = "it holds pickled objects, which layerwise never writes" if "pickle" in str(exc) else exc
        raise InputError(
            f"{str(path)!r} is not an .npz that layerwise wrote ({reason or type(exc).__name__})"
        ) from None


def _jsonl_meta(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            first = handle.readline()
        record = json.loads(first) if first.strip() else {}
    except (OSError, ValueError) as exc:
        raise InputError(f"{str(path)!r}: its first line cannot be read as JSON ({exc})") from None
    meta = record.get("layerwise") if isinstance(record, dict) else None
    if not isinstance(meta, dict):
        raise InputError(
            f"{str(path)!r} has no layerwise metadata on its first line (written by layerwise 0.2.0 or "
            "earlier, which did not record it, or by another tool)"
        )
    return meta


def _parquet_meta(path: Path) -> dict:
    from .._inputs.tables import require_pyarrow

    require_pyarrow("Parquet metadata")
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_schema(path).metadata or {}
    except Exception as exc:  # pyarrow's ArrowInvalid and OSError for a file that is not Parquet
        raise InputError(f"{str(path)!r} cannot be read as Parquet: {exc}") from None
    if b"layerwise" not in metadata:
        raise InputError(f"{str(path)!r} is a Parquet file without layerwise metadata")
    return _object(_json(metadata[b"layerwise"], path, "its 'layerwise' schema metadata"), path)


def _folder_meta(path: Path) -> dict:
    from ..store._format import read_store_meta
    from ..store._shard_table import TABLE, is_sharded, read_table, shard_path

    if is_sharded(path):
        table = read_table(path)
        shards = table.pop("shards")
        first: dict = {}
        if shards:
            try:
                first = read_store_meta(shard_path(path, shards[0]["name"])) or {}
            except NotAStoreError:
                first = {}
        # the shard's record fills in what the table did not keep, or kept as given (max_length None:
        # the model's, which each shard records resolved); else the table has the last word
        skip = {"shard", "n_texts", "format", "format_version", "meta_sha256"}
        merged = {**{k: v for k, v in first.items() if k not in skip}}
        merged.update({k: v for k, v in table.items() if v is not None or merged.get(k) is None})
        return {"kind": "sharded store", **merged, "n_shards": len(shards), "table": TABLE}
    meta = read_store_meta(path)  # StoreDamagedError when its zarr.json was damaged
    if meta is not None:
        from ..store import open_store

        # opened as a read opens it: a root that is not a group, a data array of another shape than
        # the record's or shorter than the commit marker is damage, not a description
        open_store(path)
        return {"kind": "store", **meta}
    from .._cache.format import read_meta as read_cache_meta

    cache = read_cache_meta(path)
    if cache is not None:
        return {"kind": "activation cache", **cache}
    if (path / "stats.json").is_file() and (path / "report.html").is_file():
        return _made_meta(path / "stats.json", "analysis report")
    raise InputError(
        f"{str(path)!r} is a folder that is not a layerwise store (no zarr.json with layerwise "
        "metadata) nor an activation cache (no layerwise-cache.json)"
    )


def _json(text: str | bytes, path: Path, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InputError(f"{str(path)!r}: {where} is not JSON ({exc}); the file was changed") from None


def _object(value: Any, path: Path) -> dict:
    if not isinstance(value, dict):
        raise InputError(f"{str(path)!r}: its layerwise metadata is not a JSON object")
    return value
