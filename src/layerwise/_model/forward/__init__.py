"""The in-memory forwards: packed (encoders and decoders), Hugging Face's padded one, and their
CPU and GPU helpers (oneDNN linears, attention kernels, concurrent forwards, hooks)."""
