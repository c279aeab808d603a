"""What must match for a run to resume a store: its settings (what it records of its model among
them), and every committed text."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import StoreError

if TYPE_CHECKING:
    from .._inputs.corpus import Corpus

# What the store's layout and inputs fix: a resumed run must find them unchanged too
LAYOUT_KEYS = ("row_shape", "n_texts", "pairs", "block_size", "chunk_rows", "shard_chunks", "shard")


def resume_keys(identity: str = "weights_sha256", layout: tuple[str, ...] = LAYOUT_KEYS) -> tuple[str, ...]:
    """What must match for a run to resume an existing store: the model (``identity``: by its
    weights, not by how its folder was spelled), every setting and plan entry that changes the
    numbers (their fields' metadata, settings.NUMBERS), and the ``layout``. The rest of what a store
    records of its run (batch size, concurrent forwards, device, method) does not change the numbers."""
    from .._features.plan import OutputPlan
    from .._settings.settings import Settings, numbers_keys

    return tuple(dict.fromkeys((identity, *numbers_keys(OutputPlan), *numbers_keys(Settings), *layout)))


def text_sha1(text: str, pair: str | None) -> str:
    data = text if pair is None else f"{text}\x1f{pair}"
    return hashlib.sha1(data.encode("utf-8", "surrogatepass")).hexdigest()


def check_inputs(path: Path, manifest, corpus: Corpus) -> None:
    """Every committed text must be the same input text as now (by SHA-1), or resuming would mix
    corpora. The corpus is read block by block up to the last committed text."""
    if manifest is None or not len(manifest):
        return
    committed = dict(zip(manifest["text_id"].to_pylist(), manifest["text_sha1"].to_pylist(), strict=True))
    last = max(committed)
    n_texts = len(corpus)
    if last >= n_texts:
        raise _changed(path, last)
    for block in corpus.blocks(4096, stop=last + 1):
        for local, text in enumerate(block.texts):
            text_id = block.start + local
            digest = committed.get(text_id)
            pair = block.text_pairs[local] if block.text_pairs is not None else None
            if digest is not None and text_sha1(text, pair) != digest:
                raise _changed(path, text_id)


def _changed(path: Path, text_id: int) -> StoreError:
    return StoreError(
        f"text {text_id} (input line {text_id + 1}) differs from the one in store {str(path)!r}: the input "
        "changed since the store was started; write to a new path, or pass --overwrite "
        "(Python: overwrite=True)"
    )
