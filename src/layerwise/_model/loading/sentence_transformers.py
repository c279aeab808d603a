"""What a sentence-transformers model folder says about its sentence embedding: its pooling, its
normalisation and its max_seq_length (modules.json, sentence_bert_config.json, the Pooling module's
config.json), read from the folder or the hub's local cache, never fetched."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .gguf_files import gguf_parts


@dataclass(frozen=True)
class SentenceTransformersConfig:
    """What a sentence-transformers folder says about its sentence embedding (modules.json,
    sentence_bert_config.json, the Pooling module's config.json)."""

    max_seq_length: int | None
    pool: str  # cls | mean | max | lasttoken, or ST's other modes (which layerwise does not implement)
    normalize: bool


_ST_POOL_KEYS = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"),
    ("pooling_mode_weightedmean_tokens", "weightedmean"),
    ("pooling_mode_lasttoken", "lasttoken"),
)


def _read_json(source: str, name: str) -> dict | list | None:
    """A JSON file of a model folder, or of a hub model from the local cache; None when absent."""
    path = Path(source) / name
    if not path.is_file() and not Path(source).is_dir():
        try:
            from transformers.utils import cached_file

            from .hub import hub_kwargs

            found = cached_file(
                source, name, _raise_exceptions_for_missing_entries=False, **hub_kwargs(source)
            )
        except Exception:  # offline, not cached: it is only a convention file
            return None
        path = Path(found) if found else path
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_sentence_transformers(source: str) -> SentenceTransformersConfig | None:
    """The sentence-transformers conventions of ``source``, or None when it is not such a model."""
    if gguf_parts(source) is not None:
        return None
    modules = _read_json(source, "modules.json")
    if not isinstance(modules, list):
        return None
    types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
    pooling = next(
        (m for m in modules if isinstance(m, dict) and str(m.get("type", "")).endswith("Pooling")), None
    )
    if pooling is None:
        pool = "mean"
    else:
        settings = _read_json(source, f"{pooling.get('path', '')}/config.json") or {}
        modes = [mode for key, mode in _ST_POOL_KEYS if isinstance(settings, dict) and settings.get(key)]
        pool = "+".join(modes) or "mean"
    bert_config = _read_json(source, "sentence_bert_config.json")
    max_seq = bert_config.get("max_seq_length") if isinstance(bert_config, dict) else None
    return SentenceTransformersConfig(
        max_seq_length=int(max_seq) if isinstance(max_seq, int) else None,
        pool=pool,
        normalize=any(t.endswith("Normalize") for t in types),
    )
