"""What this machine's processor offers the forward: its name and vendor, its vector units, and
whether it has bfloat16 matrix units.

bfloat16 is fast on a CPU only where the processor multiplies bfloat16 matrices in hardware: Intel's
AMX tiles (Sapphire Rapids and later), AVX-512 BF16 (Cooper Lake, AMD Zen 4 and later), or Arm's BF16
instructions (Graviton 3, Neoverse V1/N2). Elsewhere torch converts every element, and a bfloat16
matrix product runs far slower than a float32 one (benchmarks/cpu_bf16.py measures both). Read from
``/proc/cpuinfo`` (Linux); elsewhere the answers are None, and :func:`cpu_flags` empty says they
are unknown rather than absent.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

X86 = ("x86_64", "amd64", "i386", "i686", "x86")


@functools.cache
def _cpuinfo() -> tuple[str, ...]:
    try:
        return tuple(Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines())
    except OSError:
        return ()


def _field(*names: str) -> str | None:
    """The first processor's value of the first of ``names`` present in /proc/cpuinfo."""
    for line in _cpuinfo():
        key, _, value = line.partition(":")
        if key.strip() in names:
            return value.strip()
    return None


def cpu_flags() -> frozenset[str]:
    """The processor's feature flags (x86 ``flags``, Arm ``Features``); empty where unknown."""
    return frozenset((_field("flags", "Features") or "").split())


def cpu_name() -> str:
    """The processor's model name ("AMD EPYC 9B14", ...), or what the platform says."""
    return _field("model name", "Processor") or platform.processor() or platform.machine()


def cpu_vendor() -> str | None:
    """The x86 processor's vendor string (``GenuineIntel``, ``AuthenticAMD``, ...); None when this
    is not an x86 processor or its vendor cannot be read."""
    if platform.machine().lower() not in X86:
        return None
    vendor = _field("vendor_id")
    if vendor is not None:
        return vendor
    # Windows: "AMD64 Family 25 Model 1 Stepping 1, AuthenticAMD"; macOS on x86: Intel
    described = platform.processor()
    for name in ("GenuineIntel", "AuthenticAMD", "HygonGenuine"):
        if name in described:
            return name
    return "GenuineIntel" if platform.system() == "Darwin" else None


def vector_units() -> str | None:
    """The widest vector units the processor offers: "AVX-512", "AVX2", "AVX", "SVE", "NEON", or None."""
    flags = cpu_flags()
    for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sve", "SVE")):
        if flag in flags:
            return name
    return "NEON" if "asimd" in flags else None


# each half-precision dtype's matrix units, by the flag that shows them, in order of preference; an
# Arm flag counts on an Arm processor only
_HALF_UNITS = {
    "bfloat16": (
        ("amx_bf16", "AMX", False),
        ("avx512_bf16", "AVX-512 BF16", False),
        ("bf16", "Arm BF16", True),
    ),
    "float16": (
        ("amx_fp16", "AMX-FP16", False),
        ("avx512_fp16", "AVX-512 FP16", False),
        ("asimdhp", "Arm FP16", True),
    ),
}
ARM = ("aarch64", "arm64")


def _half_units(dtype: str) -> str | None:
    flags, arm = cpu_flags(), platform.machine().lower() in ARM
    return next(
        (name for flag, name, arm_only in _HALF_UNITS[dtype] if flag in flags and (arm or not arm_only)), None
    )


def bf16_units() -> str | None:
    """The processor's bfloat16 matrix units: "AMX", "AVX-512 BF16", "Arm BF16", or None (a bfloat16
    model then runs far slower than float32 on this CPU)."""
    return _half_units("bfloat16")


def fp16_units() -> str | None:
    """The processor's float16 matrix units: "AMX-FP16", "AVX-512 FP16", "Arm FP16", or None."""
    return _half_units("float16")


def matrix_units(dtype: str) -> str | None:
    """The processor's matrix units for ``dtype`` ("float32": its vector units; "bfloat16",
    "float16": their units, or None where that dtype is converted element by element)."""
    if dtype == "bfloat16":
        return bf16_units()
    if dtype == "float16":
        return fp16_units()
    return vector_units()


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, else the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
