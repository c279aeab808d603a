"""The model: where it comes from and how it loads (loading/), the in-memory forwards (forward/),
layer streaming for models larger than memory (streaming/), every model's final norm, found and
checked at load (final_norm.py), and the model built only as far as the work needs (handle.py)."""
