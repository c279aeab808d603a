"""The model: where it comes from and how it loads (loading/), the in-memory forwards (forward/),
layer streaming for models larger than memory (streaming/), the decoder LMs' conventions
(decoders.py), and the model built only as far as the work needs (handle.py)."""
