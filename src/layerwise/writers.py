"""Write extraction results to .npz or .jsonl, streaming and atomically.

Results arrive in compute order (longest inputs first) and are written as they come, so memory
stays bounded by one batch. Files are written under a temporary name next to the target and
renamed at the end: an error or an interrupt never leaves a half-written file behind.

.npz layout (``numpy.load`` reads it; no pickle)::

    meta                 JSON string: format, version, model, layers, dtype, n_texts, ...
    layers               (n_layers,) int32: hidden-state indices, 0 = embedding output
    texts, text_pairs    (n_texts,) str
    truncated            (n_texts,) bool
    hidden_{i}           (n_layers, n_tokens_i, hidden) float32 or float16
    tokens_{i}           (n_tokens_i,) str, wordpieces incl. [CLS]/[SEP]
    offsets_{i}          (n_tokens_i, 2) int32 character spans, word_ids_{i}, segment_ids_{i}

.jsonl: one object per input, in input order, with the same fields (hidden as nested lists).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Literal

import numpy as np

from .errors import OptionError, check_choice
from .extract import LayerStack

OutputDtype = Literal["float32", "float16"]
FORMATS = (".npz", ".jsonl")


def output_format(path: str | Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise OptionError(
            f"output {str(path)!r} has an unknown suffix {suffix!r}; use .npz (compact arrays) or .jsonl"
        )
    return suffix


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path next to ``path`` that replaces it only if the block succeeds."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise OptionError(f"output folder {str(directory)!r} does not exist; create it first")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_results(
    path: str | Path,
    results: Iterable[tuple[int, LayerStack]],
    *,
    n_texts: int,
    meta: dict,
    dtype: OutputDtype = "float32",
) -> dict:
    """Write ``(index, LayerStack)`` pairs to ``path`` (.npz or .jsonl). Returns summary counts."""
    check_choice("dtype", dtype, ("float32", "float16"))
    path = Path(path)
    fmt = output_format(path)
    with atomic_path(path) as tmp:
        if fmt == ".npz":
            summary = _write_npz(tmp, results, n_texts, meta, dtype)
        else:
            summary = _write_jsonl(tmp, results, n_texts, meta, dtype)
    return summary


def _put(zf: zipfile.ZipFile, name: str, array: np.ndarray) -> None:
    with zf.open(f"{name}.npy", "w", force_zip64=True) as handle:
        np.lib.format.write_array(handle, np.asanyarray(array), allow_pickle=False)


def _check_complete(seen: set[int], n_texts: int) -> None:
    if len(seen) != n_texts:
        raise RuntimeError(f"expected {n_texts} results, got {len(seen)}")


def _write_npz(
    tmp: Path, results: Iterable[tuple[int, LayerStack]], n_texts: int, meta: dict, dtype: str
) -> dict:
    texts: list[str] = [""] * n_texts
    pairs: list[str | None] = [None] * n_texts
    truncated = np.zeros(n_texts, dtype=bool)
    seen: set[int] = set()
    layers: tuple[int, ...] = ()
    n_tokens = 0
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for i, stack in results:
            _put(zf, f"hidden_{i}", stack.hidden.astype(dtype, copy=False))
            _put(zf, f"tokens_{i}", np.asarray(stack.tokens, dtype=str))
            _put(zf, f"offsets_{i}", stack.offsets)
            _put(zf, f"word_ids_{i}", stack.word_ids)
            _put(zf, f"segment_ids_{i}", stack.segment_ids)
            texts[i], pairs[i], truncated[i] = stack.text, stack.text_pair, stack.truncated
            layers = stack.layers
            n_tokens += stack.n_tokens
            seen.add(i)
        _check_complete(seen, n_texts)
        _put(zf, "layers", np.asarray(meta.get("layers", layers), dtype=np.int32))
        _put(zf, "texts", np.asarray(texts, dtype=str))
        if any(p is not None for p in pairs):
            _put(zf, "text_pairs", np.asarray([p or "" for p in pairs], dtype=str))
        _put(zf, "truncated", truncated)
        full_meta = {
            **meta,
            "format": "layerwise-npz",
            "format_version": 1,
            "dtype": dtype,
            "n_texts": n_texts,
        }
        _put(zf, "meta", np.asarray(json.dumps(full_meta)))
    return {"n_texts": n_texts, "n_tokens": n_tokens, "n_truncated": int(truncated.sum())}


def _record(index: int, stack: LayerStack, dtype: str, model: str | None) -> dict:
    record = {"id": index, "model": model, "text": stack.text}
    if stack.text_pair is not None:
        record["text_pair"] = stack.text_pair
    if stack.words is not None:
        record["words"] = list(stack.words)
    record.update(
        layers=list(stack.layers),
        tokens=list(stack.tokens),
        offsets=stack.offsets.tolist(),
        word_ids=stack.word_ids.tolist(),
        segment_ids=stack.segment_ids.tolist(),
        truncated=stack.truncated,
        # float32 -> Python float is exact, so reading the numbers back gives the same float32.
        hidden=stack.hidden.astype(dtype, copy=False).tolist(),
    )
    return record


def _write_jsonl(
    tmp: Path, results: Iterable[tuple[int, LayerStack]], n_texts: int, meta: dict, dtype: str
) -> dict:
    # Results come longest first; spool them, then copy the lines out in input order.
    spans: dict[int, tuple[int, int]] = {}
    n_tokens = n_truncated = 0
    with tempfile.TemporaryFile(dir=tmp.parent) as spool:
        for i, stack in results:
            line = (
                json.dumps(_record(i, stack, dtype, meta.get("model")), ensure_ascii=False) + "\n"
            ).encode("utf-8")
            spans[i] = (spool.tell(), len(line))
            spool.write(line)
            n_tokens += stack.n_tokens
            n_truncated += stack.truncated
        _check_complete(set(spans), n_texts)
        with open(tmp, "wb") as out:
            for i in range(n_texts):
                _copy_span(spool, out, *spans[i])
    return {"n_texts": n_texts, "n_tokens": n_tokens, "n_truncated": n_truncated}


def _copy_span(src: IO[bytes], dst: IO[bytes], start: int, length: int) -> None:
    src.seek(start)
    dst.write(src.read(length))
