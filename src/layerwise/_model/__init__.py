"""Finding and running the model: where it comes from and how it loads (source), the model built
only as far as the work needs (handle), the light model and the packed forward (light, packed),
the CPU's linear layers (cpu_gemm), concurrent forward streams (streams), and hooks for sub-layer
taps (hooks)."""
