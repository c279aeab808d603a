"""The packed forward's linear layers on the CPU: oneDNN with weights prepacked once, where it wins.

Why: torch's CPU wheels run a float32 ``F.linear`` on MKL, and MKL picks its code path by the
processor's vendor: on AMD it runs its AVX2 code, 80-100 GFLOP/s per core on an AMD EPYC with
AVX-512, where oneDNN (also inside torch) reaches 190-230 with the weight reordered once into its
blocked layout (benchmarks/gemm_speed.py; linear layers are 85 % of a BERT forward). On Intel
processors MKL runs its AVX-512 code and the two are level (155-165 GFLOP/s per core on a Xeon with
AVX-512), and there oneDNN loses: it compiles a kernel for every new row count (about 1 ms per
weight shape, four per layer; a packed batch's row count changes with every batch), which MKL does
not. A server on that Xeon served 8 % fewer tokens/s with oneDNN than with MKL. So the default
(``LAYERWISE_ONEDNN`` unset or ``auto``) is oneDNN on x86 processors not made by Intel, MKL
(``F.linear``) on Intel's and anywhere else; ``LAYERWISE_ONEDNN=1`` / ``0`` forces it on / off.

The results equal ``F.linear`` to float rounding (a different order of summation: relative
differences of 1e-6, like MKL's own across batch shapes).

:class:`PrepackedLinears` keeps each weight's packed copy (stamped with the tensor's version
counter: a weight edited in place after loading is repacked, never served stale) and falls back to
``F.linear`` for anything else: another device or dtype, a torch without oneDNN, or one whose
private ``mkldnn._linear_pointwise`` op disagrees with ``F.linear`` on a first check (it is what
``torch.compile`` uses for frozen CPU linears, not a public API).

oneDNN caches each compiled primitive, in two caches (ideep's and its own) of 1,024 entries each by
default, at 0.5-1 MB apiece. The packed forward's row count changes with every batch, so a server
filled them: its RSS rose from 920 to 1,850 MiB over a few minutes of load. Both are bounded at
PRIMITIVE_CACHE entries here (unless the environment sets them): RSS then stays within about 100
MiB of the start, and random row counts ran 5 % slower than with unbounded caches (ad-hoc, 1,500
random shapes; still 1.6x MKL on the AMD EPYC). The variables are read at oneDNN's first use, so
this module sets them on import, before any forward.
"""

from __future__ import annotations

import logging
import os
import threading

import torch
import torch.nn.functional as F

from ..._host.cpu import cpu_vendor

logger = logging.getLogger("layerwise")

PRIMITIVE_CACHE = 64
for _variable in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"):
    os.environ.setdefault(_variable, str(PRIMITIVE_CACHE))

_checked: bool | None = None  # None: not decided yet in this process
_OFF, _ON = ("0", "false", "no", "off"), ("1", "true", "yes", "on")
_check_lock = threading.Lock()


def onednn_usable() -> bool:
    """The packed forward's linear layers run on oneDNN here: wanted (:func:`onednn_wanted`), there,
    and agreeing with ``F.linear`` (decided once per process)."""
    global _checked
    if _checked is None:
        with _check_lock:
            if _checked is None:
                _checked = onednn_wanted() and _self_check()
    return _checked


def onednn_wanted() -> bool:
    """``LAYERWISE_ONEDNN``: on (1, true, yes, on), off (0, false, no, off), or ``auto`` (unset):
    on for x86 processors whose vendor is not Intel, where MKL runs its AVX2 code."""
    setting = os.environ.get("LAYERWISE_ONEDNN", "auto").strip().lower()
    if setting in _OFF:
        return False
    if setting in _ON:
        return True
    if setting != "auto":
        logger.warning("LAYERWISE_ONEDNN=%r not understood (use 1, 0 or auto): using auto", setting)
    vendor = cpu_vendor()
    return vendor is not None and vendor != "GenuineIntel"


def _self_check() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        x, weight, bias = (torch.randn(*shape, generator=generator) for shape in ((7, 48), (40, 48), (40,)))
        with torch.inference_mode():
            fast = onednn_linear(x, prepack(weight), bias)
            close = torch.allclose(fast, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    except (AttributeError, RuntimeError) as exc:  # op missing, or renamed in another torch release
        logger.info("oneDNN prepacked linear unavailable (%s): using F.linear", exc)
        return False
    if not close:
        logger.warning("oneDNN prepacked linear disagrees with F.linear in this torch build: using F.linear")
    return close


def prepack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (out, in) reordered into oneDNN's blocked layout, for :func:`onednn_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` on oneDNN, ``packed`` = ``prepack(weight)``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PrepackedLinears:
    """``linear(x, weight, bias)``: oneDNN with ``weight`` prepacked (cached) for 2-D float32 CPU
    inputs outside autograd; ``F.linear`` otherwise. One per model (it holds packed copies of the
    model's weights: as much memory again as its linear layers)."""

    def __init__(self) -> None:
        # id(weight) -> (weight, its version, packed copy)
        self._packed: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}
        self._lock = threading.Lock()

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if not self._applies(x, weight):
            return F.linear(x, weight, bias)
        return onednn_linear(x.contiguous(), self._pack(weight), bias)

    def _applies(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        return (
            x.device.type == "cpu"
            and x.dim() == 2
            and x.dtype == torch.float32
            and weight.dtype == torch.float32
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and onednn_usable()
        )

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        # inference tensors (packed.py's fused QKV weight, made under inference_mode) have no version
        # counter; that one is rebuilt, as a new tensor, whenever its parts change
        version = -1 if weight.is_inference() else weight._version
        entry = self._packed.get(id(weight))
        # the weight itself is held in the entry, so its id cannot be reused by another tensor
        if entry is None or entry[0] is not weight or entry[1] != version:
            with self._lock:  # two concurrent forwards may ask at once: pack once
                entry = self._packed.get(id(weight))
                if entry is None or entry[0] is not weight or entry[1] != version:
                    entry = (weight, version, prepack(weight))
                    self._packed[id(weight)] = entry
        return entry[2]

    def forget(self) -> None:
        """Drop every packed copy (the model's weights were replaced)."""
        with self._lock:
            self._packed.clear()
