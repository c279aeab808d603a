"""The activation cache: token activations of several layers for SAE and probe training, in a
shuffled, resumable Hugging Face ``datasets`` folder (format.py, writer.py)."""

from .format import hook_name
from .load import load_cache
from .verify import verify_cache
from .writer import CacheSummary, cache_activations, permutation

__all__ = ["CacheSummary", "cache_activations", "hook_name", "load_cache", "permutation", "verify_cache"]
