"""CRC-32 of the bytes layerwise writes and reads back (a store's rows and manifest parts, a
cache's shards and index files), as fast as this machine allows.

The checksum is zlib's CRC-32 (the IEEE polynomial) everywhere. zlib-ng (the ``zlib-ng`` package,
in the ``store`` and ``cache`` extras) computes the same CRC-32 with the processor's carry-less
multiply (PCLMULQDQ / VPCLMULQDQ); the system zlib that Python's ``zlib`` module links to often
does not. The value is the same bit for bit, so stores and caches written with either read with
either, and nothing in the formats changes (``benchmarks/writer_speed.py`` measures the writers).
Both release the GIL on large buffers, so a writer's thread checksums while the forward runs.
"""

from __future__ import annotations

from typing import Any

try:  # the same CRC-32, faster where the system zlib lacks the vectorised kernel
    from zlib_ng.zlib_ng import crc32 as _crc32
except ImportError:  # pragma: no cover - the extras install it
    from zlib import crc32 as _crc32

IMPLEMENTATION = "zlib-ng" if _crc32.__module__.startswith("zlib_ng") else "zlib"


def crc32(data: Any, value: int = 0) -> int:
    """zlib's CRC-32 of ``data`` (any contiguous buffer: bytes, a C-contiguous NumPy array),
    continued from ``value``."""
    return _crc32(data, value)
