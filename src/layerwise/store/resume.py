"""What must match for a run to resume a store: its settings, and every committed text."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from ..errors import StoreError

# Settings that must match for a run to resume an existing store. The model is compared by its
# weights, not by how its folder was spelled.
RESUME_KEYS = (
    "weights_sha256", "layers", "level", "pool", "fuse", "special_tokens", "normalize", "dtype", "row_shape",
    "long_texts", "stride", "max_length", "n_texts", "pairs", "block_size", "chunk_rows", "shard_chunks",
    "shard",
)  # fmt: skip


def text_sha1(text: str, pair: str | None) -> str:
    data = text if pair is None else f"{text}\x1f{pair}"
    return hashlib.sha1(data.encode("utf-8", "surrogatepass")).hexdigest()


def check_inputs(path: Path, manifest, texts: Sequence[str], text_pairs: Sequence[str] | None) -> None:
    """Every committed text must be the same input text as now (by SHA-1), or resuming would mix corpora."""
    if manifest is None:
        return
    ids = manifest["text_id"].to_pylist()
    hashes = manifest["text_sha1"].to_pylist()
    for text_id, digest in zip(ids, hashes, strict=True):
        pair = text_pairs[text_id] if text_pairs is not None and text_id < len(text_pairs) else None
        if text_id >= len(texts) or text_sha1(texts[text_id], pair) != digest:
            raise StoreError(
                f"text {text_id} (input line {text_id + 1}) differs from the one in store "
                f"{str(path)!r}: the input changed since the store was started; write to a new "
                "path, or pass --overwrite (Python: overwrite=True)"
            )
