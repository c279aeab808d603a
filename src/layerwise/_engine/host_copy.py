"""A forward's outputs on their way from a GPU to the host, started without waiting for them.

On a CUDA device the engine copies each batch's hidden states into page-locked (pinned) host
memory with ``non_blocking=True`` right after launching its forward, and reads them only when the
next batch's forward has been launched: the GPU computes batch k+1 while the host turns batch k
into float32 NumPy (benchmarks/gpu_speed.py measures it). Three things make that fast:

- the copy leaves the GPU in the model's own dtype (half the bytes of float32 for float16 and
  bfloat16 models) and is widened to float32 on the host;
- the pinned buffers come from torch's caching host allocator, so after the first batches no new
  page-locked memory is allocated (and none is handed to the caller: results live in ordinary
  memory, filled by torch's multithreaded CPU copy);
- the NaN/inf test's sum stays on the device until the batch is read, so launching never waits.

On the CPU there is nothing to overlap: the tensors are read at once. The padded forward's batches
take the same way to the host, read at once on any device.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

# the dtypes results may be asked in (extract(dtype=...)); NumPy has no bfloat16
RESULT_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16}


def _to_numpy(tensor: torch.Tensor, dtype: torch.dtype = torch.float32) -> np.ndarray:
    """A host copy of ``tensor`` (any device, any float dtype) in ``dtype``."""
    return tensor.detach().to("cpu", dtype=dtype).numpy()


class HostCopy:
    """``hidden`` and ``taps`` of one batch, copied to the host; :meth:`arrays` waits for them."""

    def __init__(
        self, hidden: torch.Tensor, taps: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float32
    ) -> None:
        # one cheap whole-batch test for Rows.nonfinite: a sum is NaN/inf when any term is (or when it
        # overflows: the caller then looks at the rows one by one); isfinite().all() costs 30x more
        self._event, self._dtype = None, dtype
        tensors = {"": hidden, **taps}
        self._peak = None
        if dtype != torch.float16 or not hidden.numel():
            self._check = hidden.sum()
        else:
            # float16 results are cast here, before the host sees them: their smallest and largest
            # values go along instead of the sum (one pass, a little dearer than a sum; NaN and inf
            # show in them too), so that a value past float16's range is refused, not stored as inf
            ends = torch.stack([torch.stack(torch.aminmax(t.detach())).float() for t in tensors.values()])
            self._check, self._peak = ends.sum(), ends.abs().max()
        if hidden.device.type != "cuda":
            self._host = {name: _to_numpy(t, dtype) for name, t in tensors.items()}
            return
        # float32 results leave in the model's dtype and are widened on the host (fewer bytes);
        # float16 results are cast on the device, and cross and stay float16
        narrowed = {name: t if dtype == torch.float32 else t.to(dtype) for name, t in tensors.items()}
        self._staged = {name: _pinned_copy(t) for name, t in narrowed.items()}
        self._event = torch.cuda.Event()
        # on the stream the copies went to: the tensors' device's (cuda:1 need not be the current device)
        self._event.record(torch.cuda.current_stream(hidden.device))

    def arrays(self) -> tuple[np.ndarray, dict[str, np.ndarray], bool]:
        """``(hidden, taps, finite)`` as NumPy in ordinary host memory, in the dtype asked for."""
        if self._event is not None:
            self._event.synchronize()
            self._host = {name: _widened(t, self._dtype) for name, t in self._staged.items()}
            self._staged, self._event = {}, None  # the pinned buffers go back to torch's cache
        finite = bool(torch.isfinite(self._check))
        host = dict(self._host)
        hidden = host.pop("")
        return hidden, host, finite

    def peak(self) -> float:
        """The largest magnitude of a float16 result before its cast (0.0 for other dtypes): past
        65,504 the cast made inf of it (call after :meth:`arrays`)."""
        return 0.0 if self._peak is None else float(self._peak)


def _pinned_copy(tensor: torch.Tensor) -> torch.Tensor:
    staging = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    staging.copy_(tensor.detach(), non_blocking=True)
    return staging


def _widened(staging: torch.Tensor, dtype: torch.dtype = torch.float32) -> np.ndarray:
    """``dtype`` in fresh pageable memory (torch's CPU copy runs on its threads, page faults too)."""
    out = torch.empty(staging.shape, dtype=dtype)
    out.copy_(staging)
    return out.numpy()
