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

from ._version import __version__

# public name -> module that defines it
_EXPORTS = {
    "DEFAULT_MODEL": "_model.loading.source",
    "EncodedInput": "_inputs.encoding",
    "FUSIONS": "_features.names",
    "Encoder": "_encoder",
    "InputError": "errors",
    "InputTooLargeError": "errors",
    "LayerSpecError": "errors",
    "LayerStack": "_results",
    "LayerwiseError": "errors",
    "MissingDependencyError": "errors",
    "ModelLoadError": "errors",
    "NonFiniteError": "errors",
    "OptionError": "errors",
    "OutputError": "errors",
    "ProbeResult": "_probing",
    "ScalarMix": "_features.scalar_mix",
    "SentenceVector": "_results",
    "TAPS": "_model.forward.hooks",
    "Store": "store",
    "StoreError": "errors",
    "WordVectors": "_results",
    "default_model_path": "_model.loading.source",
    "extract_to_store": "store",
    "open_store": "store",
    "OutputPlan": "_features.plan",
    "extract_to_file": "_files.writers",
    "verify_store": "store",
    "NotAStoreError": "errors",
    "StoreDamagedError": "errors",
    "fuse_layers": "_features.fuse",
    "layer_deltas": "_features.fuse",
    "layer_drift": "_features.fuse",
    "pool_sentence": "_features.pool",
    "probe": "_probing",
    "read_npz_texts": "_files.writers",
    "read_npz_ids": "_files.writers",
    "Corpus": "_inputs.corpus",
    "export_store": "_files.export",
    "pool_words": "_features.pool",
    "resolve_layers": "_features.layers",
    "Settings": "_settings.settings",
    "read_meta": "_files.meta",
    "cache_activations": "_cache",
    "CacheSummary": "_cache",
    "verify_cache": "_cache",
    "load_cache": "_cache",
    "CacheOptions": "_cache.options",
    "StoreLayout": "store._format",
}

# submodules exposed as namespaces (lw.analyze.layer_similarity(...)): name -> module
_SUBMODULES = {"analyze": "analyze", "ray": "ray"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "__version__"])

if TYPE_CHECKING:
    from . import analyze, ray
    from ._cache import CacheSummary, cache_activations, load_cache, verify_cache
    from ._cache.options import CacheOptions
    from ._encoder import Encoder
    from ._features.fuse import fuse_layers, layer_deltas, layer_drift
    from ._features.layers import resolve_layers
    from ._features.names import FUSIONS
    from ._features.plan import OutputPlan
    from ._features.pool import pool_sentence, pool_words
    from ._features.scalar_mix import ScalarMix
    from ._files.export import export_store
    from ._files.meta import read_meta
    from ._files.writers import extract_to_file, read_npz_ids, read_npz_texts
    from ._inputs.corpus import Corpus
    from ._inputs.encoding import EncodedInput
    from ._model.forward.hooks import TAPS
    from ._model.loading.source import DEFAULT_MODEL, default_model_path
    from ._probing import ProbeResult, probe
    from ._results import LayerStack, SentenceVector, WordVectors
    from ._settings.settings import Settings
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
    from .store import Store, extract_to_store, open_store, verify_store
    from .store._format import StoreLayout


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
