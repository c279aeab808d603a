"""Which weights a run used: a SHA-256 of every parameter and buffer, names and bytes, that every
output records (a store's resume, the server's model check and the cache compare it), the same for
a model in memory and a streamed one read from its checkpoint."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any


def weights_sha256(model) -> str:
    """A hash of every parameter and buffer of ``model`` (names and bytes), to tell models apart;
    but not of a pooler that the checkpoint lacked (transformers fills it with new random numbers
    at every load, and a store's resume compares this hash). Remembered on the model while no
    tensor has changed (torch counts in-place writes in each tensor's ``_version``): an actor
    writing many shards hashes its weights once."""
    from ..notes import note, noted

    streamed = noted(model, "streamed")
    if streamed is not None:  # a skeleton of meta tensors: the same bytes, read from its checkpoint
        return streamed.weights_sha256()
    skipped = noted(model, "not_loaded", ())
    state = sorted((k, v) for k, v in model.state_dict().items() if not k.startswith(skipped))
    fingerprint = tuple((name, t.data_ptr(), t._version) for name, t in state)
    cached = noted(model, "weights_sha256")
    if cached is not None and cached[0] == fingerprint:
        return cached[1]
    if any(t.is_meta for _, t in state):  # accelerate keeps an offloaded layer's weights off the model
        from .placement import offloaded_tensor

        state = [(k, offloaded_tensor(model, k).to(t.dtype) if t.is_meta else t) for k, t in state]
    hexdigest = tensors_sha256(state)
    note(model, "weights_sha256", (fingerprint, hexdigest))
    return hexdigest


def tensors_sha256(named: Iterable[tuple[str, Any]]) -> str:
    """The digest of ``(name, tensor)`` pairs in the given order: each name, then its bytes. The one
    format of :func:`weights_sha256`, for a model in memory and a streamed one read from its
    checkpoint (streaming/forward.py) alike, so that the two hash the same weights to the same value."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in named:
        digest.update(name.encode())
        flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        digest.update(memoryview(flat.numpy()))
    return digest.hexdigest()
