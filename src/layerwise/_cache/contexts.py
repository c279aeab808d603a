"""A corpus as fixed-length contexts of token ids, the way SAE trainers cut it.

Documents are tokenised without special tokens and joined into one stream, a separator token
between two documents; the stream is cut into windows of ``context - len(begin) - len(end)``
tokens, and each window is framed into one context:

* decoders whose tokenizer starts a text with BOS (Llama, Gemma, …): ``BOS + window``, documents
  separated by BOS (SAELens' ``prepend_bos`` with ``sequence_separator_token_id = BOS``); a window
  that would start with the separator drops it (never two BOS in a row);
* decoders whose tokenizer adds nothing (SmolLM2, Qwen, GPT-2): ``window`` alone, documents
  separated by EOS (what the model saw between documents in training);
* BERT-family encoders: ``[CLS] + window + [SEP]``, documents separated by ``[SEP]``.

A context may hold the end of one document and the start of the next: it is one forward sequence,
so its activations depend only on its own ``token_ids``. The stream's last partial window is
dropped. Contexts stop at ``n_max`` (the ``tokens`` asked for) or the corpus' end.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Framing:
    begin: tuple[int, ...]
    end: tuple[int, ...]
    separator: tuple[int, ...]

    def as_dict(self) -> dict:
        return {"begin": list(self.begin), "end": list(self.end), "separator": list(self.separator)}


def framing_for(tokenizer: Any, is_decoder: bool) -> Framing:
    """How this model's contexts begin, end and separate documents (module docstring)."""
    probe = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    bare = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    if not is_decoder:
        cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        begin = (cls,) if cls is not None and probe[:1] == [cls] else ()
        end = (sep,) if sep is not None and probe[-1:] == [sep] else ()
        return Framing(begin, end, end or begin)
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if bos is not None and probe[:1] == [bos] and bare[:1] != [bos]:
        return Framing((bos,), (), (bos,))
    return Framing((), (), (eos,) if eos is not None else ())


@dataclass(frozen=True)
class Contexts:
    n_contexts: int
    n_documents: int
    sha256: str
    exhausted: bool  # the corpus ended before n_max contexts


def write_contexts(
    texts_blocks, tokenizer: Any, framing: Framing, context: int, n_max: int, out: Path
) -> Contexts:
    """Tokenise the corpus (blocks of texts) into at most ``n_max`` contexts, written to ``out``
    as int32 rows, source order. Memory: one block's tokens and one window."""
    body = context - len(framing.begin) - len(framing.end)
    begin = np.asarray(framing.begin, dtype=np.int32)
    end = np.asarray(framing.end, dtype=np.int32)
    separator = np.asarray(framing.separator, dtype=np.int32)
    digest = hashlib.sha256()
    pending = np.zeros(0, dtype=np.int32)
    written = documents = 0
    exhausted = True
    with open(out, "wb") as handle:
        for texts in texts_blocks:
            # whole documents, longer than the model takes: they are cut into contexts below
            encoded = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
            pieces = [pending]
            for ids in encoded:
                if documents:
                    pieces.append(separator)
                pieces.append(np.asarray(ids, dtype=np.int32))
                documents += 1
            stream = np.concatenate(pieces)
            rows, stream = _cut(stream, body, separator if len(begin) and _same(begin, separator) else None)
            rows = rows[: n_max - written]
            if len(rows):
                framed = np.concatenate(
                    [
                        np.broadcast_to(begin, (len(rows), len(begin))),
                        rows,
                        np.broadcast_to(end, (len(rows), len(end))),
                    ],
                    axis=1,
                ).astype(np.int32)
                data = np.ascontiguousarray(framed).tobytes()
                handle.write(data)
                digest.update(data)
                written += len(rows)
            pending = stream
            if written >= n_max:
                exhausted = False
                break
        handle.flush()
        import os

        os.fsync(handle.fileno())
    return Contexts(written, documents, digest.hexdigest(), exhausted)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return len(a) == len(b) and bool((a == b).all())


def _cut(stream: np.ndarray, body: int, drop_leading: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Whole windows of ``body`` tokens from ``stream``, and what is left. ``drop_leading``: a
    separator that the context's begin token already stands for, dropped where a window would
    start with it."""
    rows: list[np.ndarray] = []
    start = 0
    width = len(drop_leading) if drop_leading is not None else 0
    while True:
        if width and stream[start : start + width].tolist() == drop_leading.tolist():  # type: ignore[union-attr]
            start += width
        if len(stream) - start < body:
            break
        if not width:  # no separator to drop: the rest of the windows in one reshape
            n = (len(stream) - start) // body
            rows.append(stream[start : start + n * body].reshape(n, body))
            start += n * body
            continue
        rows.append(stream[start : start + body][None])
        start += body
    windows = np.concatenate(rows) if rows else np.zeros((0, body), dtype=np.int32)
    return windows, stream[start:]


def read_contexts(path: Path, context: int, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` of the contexts file, ``(len(rows), context)`` int32, read row by row in file
    order. Not a memory map: the pages a map touches count in the process' resident memory, and a
    shuffled run touches all of them (4 bytes a token); these reads leave them to the page cache."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty((len(rows), context), dtype=np.int32)
    width = context * 4
    with open(path, "rb", buffering=0) as handle:
        for i in np.argsort(rows, kind="stable"):
            handle.seek(int(rows[i]) * width)
            if handle.readinto(memoryview(out[i]).cast("B")) != width:
                raise ValueError(f"{path} ends before context {int(rows[i])}")
    return out
