"""layerwise: contextual embeddings from every encoder layer of BERT-family models.

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

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "DEFAULT_MODEL": "model_source",
    "EncodedInput": "inputs",
    "FUSIONS": "fuse",
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
    "ScalarMix": "scalar_mix",
    "SentenceVector": "results",
    "TAPS": "hooks",
    "Store": "store",
    "StoreError": "errors",
    "WordVectors": "results",
    "default_model_path": "model_source",
    "extract_to_store": "store",
    "open_store": "store",
    "OutputPlan": "plan",
    "extract_to_file": "writers",
    "verify_store": "store",
    "NotAStoreError": "errors",
    "StoreDamagedError": "errors",
    "fuse_layers": "fuse",
    "layer_deltas": "fuse",
    "layer_drift": "fuse",
    "pool_sentence": "pool",
    "probe": "probing",
    "read_npz_texts": "writers",
    "read_npz_ids": "writers",
    "Corpus": "corpus",
    "export_store": "export",
    "pool_words": "pool",
    "resolve_layers": "layers",
}

# submodules exposed as namespaces: lw.analyze.layer_similarity(...)
_SUBMODULES = ("analyze", "ray")

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "__version__"])

if TYPE_CHECKING:
    from . import analyze, ray
    from .corpus import Corpus
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
    from .export import export_store
    from .fuse import FUSIONS, fuse_layers, layer_deltas, layer_drift
    from .hooks import TAPS
    from .inputs import EncodedInput
    from .layers import resolve_layers
    from .model_source import DEFAULT_MODEL, default_model_path
    from .plan import OutputPlan
    from .pool import pool_sentence, pool_words
    from .probing import ProbeResult, probe
    from .results import LayerStack, SentenceVector, WordVectors
    from .scalar_mix import ScalarMix
    from .store import Store, extract_to_store, open_store, verify_store
    from .writers import extract_to_file, read_npz_ids, read_npz_texts


def __getattr__(name: str) -> object:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'layerwise' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
