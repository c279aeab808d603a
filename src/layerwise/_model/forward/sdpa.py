"""Which kernels ``scaled_dot_product_attention`` may pick on a GPU: any but cuDNN's.

The packed forward runs attention on grids of many shapes (one per group of similar lengths,
packed.py), and a new corpus brings new shapes; the padded forward's ``(B, T)`` changes with every
batch. For float16 and bfloat16 on an H100, torch picks cuDNN's attention, and cuDNN builds an
execution plan for each new shape: a fresh Encoder's first ``embed`` of 2,050 mixed texts spent
7.3 of its 8.4 s in attention, the second call 0.04 of its 0.57 s (torch 2.11,
benchmarks/gpu_profile.py). Flash and memory-efficient attention have no per-shape set-up: with
them the first call took 0.52 s and the second 0.25 s (benchmarks/gpu_speed.py --part embed,
float16).

``sdpa_kernel`` sets process-wide flags, so it is entered only for CUDA devices (the CPU's concurrent
forwards never touch them); two threads' GPU forwards at once can only change which of the allowed
kernels runs, not what is computed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def attention_kernels(device: torch.device) -> Iterator[None]:
    """Inside: on a CUDA ``device``, attention without cuDNN's kernels; elsewhere nothing changes."""
    if device.type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield
