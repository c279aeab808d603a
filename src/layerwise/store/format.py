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
      manifest/part-*.parquet   one row per stored text: text_id (input line order), position
                                (store order), text, text_pair, text_sha1, start, n_rows, truncated,
                                and per level: tokens, char_start, char_end, word_ids, segment_ids |
                                words, char_start, char_end, segment_ids, words_lost
      .lock                     held (flock) by the one process that writes

Texts are stored block by block (``block_size`` input texts), longest first within a block, the
order extraction runs in; ``text_id`` maps back to input order.
"""

from __future__ import annotations

FORMAT = "layerwise-store"
FORMAT_VERSION = 1
DATA = "data"
OFFSETS = "offsets"
MANIFEST = "manifest"
LOCK = ".lock"
ATTRIBUTE = "layerwise"
CHUNK_ROWS = 128
SHARD_CHUNKS = 64
OFFSETS_CHUNK = 4096
BLOCK_SIZE = 2048


def require_store_dependencies() -> None:
    """zarr and pyarrow are an extra: say how to install them when they are missing."""
    from ..errors import MissingDependencyError

    missing = []
    for module in ("zarr", "pyarrow"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise MissingDependencyError(
            f"the store needs {' and '.join(missing)}: pip install 'layerwise[store]' "
            "(or pip install zarr pyarrow)"
        )
