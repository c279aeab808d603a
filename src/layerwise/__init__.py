"""layerwise: contextual embeddings from every layer of transformer encoders and decoder LMs.

    import layerwise as lw
    enc = lw.Encoder()                      # the packaged all-MiniLM-L6-v2, offline
    stacks = enc.extract(["The bank raised rates."], layers="all")
    stacks[0].hidden.shape                  # (n_layers, n_tokens, hidden) = (7, 7, 384)

Names are imported lazily so that ``import layerwise`` (and ``layerwise --help``) stays fast and
does not import torch until a model is needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.3.0.dev0"

# public name -> module that defines it
_EXPORTS = {
    "DEFAULT_MODEL": "model.source",
    "EncodedInput": "inputs.encoding",
    "FUSIONS": "features.fuse",
    "Encoder": "encoder",
    "InputError": "errors",
    "InputTooLargeError": "errors",
    "LayerSpecError": "errors",
    "LayerStack": "results",
    "LayerwiseError": "errors",
    "MissingDependencyError": "errors",
    "ModelLoadError": "errors",
    "NonFiniteError": "errors",
    "OptionError": "errors",
    "OutputError": "errors",
    "ProbeResult": "probing",
    "ScalarMix": "features.scalar_mix",
    "SentenceVector": "results",
    "TAPS": "model.hooks",
    "Store": "store",
    "StoreError": "errors",
    "WordVectors": "results",
    "default_model_path": "model.source",
    "extract_to_store": "store",
    "open_store": "store",
    "OutputPlan": "features.plan",
    "extract_to_file": "files.writers",
    "verify_store": "store",
    "NotAStoreError": "errors",
    "StoreDamagedError": "errors",
    "fuse_layers": "features.fuse",
    "layer_deltas": "features.fuse",
    "layer_drift": "features.fuse",
    "pool_sentence": "features.pool",
    "probe": "probing",
    "read_npz_texts": "files.writers",
    "read_npz_ids": "files.writers",
    "Corpus": "inputs.corpus",
    "export_store": "files.export",
    "pool_words": "features.pool",
    "resolve_layers": "features.layers",
    "Settings": "settings",
    "read_meta": "files.meta",
    "cache_activations": "cache",
    "CacheSummary": "cache",
    "verify_cache": "cache",
    "load_cache": "cache",
    "CacheOptions": "cache.options",
    "StoreLayout": "store.format",
}

# submodules exposed as namespaces (lw.analyze.layer_similarity(...)): name -> module
_SUBMODULES = {"analyze": "analysis.stats", "ray": "ray"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "__version__"])

if TYPE_CHECKING:
    from . import ray
    from .analysis import stats as analyze
    from .cache import CacheSummary, cache_activations, load_cache, verify_cache
    from .cache.options import CacheOptions
    from .encoder import Encoder
    from .errors import (
        InputError,
        InputTooLargeError,
        LayerSpecError,
        LayerwiseError,
        MissingDependencyError,
        ModelLoadError,
        NonFiniteError,
        NotAStoreError,
        OptionError,
        OutputError,
        StoreDamagedError,
        StoreError,
    )
    from .features.fuse import fuse_layers, layer_deltas, layer_drift
    from .features.layers import resolve_layers
    from .features.names import FUSIONS
    from .features.plan import OutputPlan
    from .features.pool import pool_sentence, pool_words
    from .features.scalar_mix import ScalarMix
    from .files.export import export_store
    from .files.meta import read_meta
    from .files.writers import extract_to_file, read_npz_ids, read_npz_texts
    from .inputs.corpus import Corpus
    from .inputs.encoding import EncodedInput
    from .model.hooks import TAPS
    from .model.source import DEFAULT_MODEL, default_model_path
    from .probing import ProbeResult, probe
    from .results import LayerStack, SentenceVector, WordVectors
    from .settings import Settings
    from .store import Store, extract_to_store, open_store, verify_store
    from .store.format import StoreLayout


def __getattr__(name: str) -> object:
    if name in _SUBMODULES:
        return importlib.import_module(f".{_SUBMODULES[name]}", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'layerwise' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
