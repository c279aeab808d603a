"""The CRC-32 every store and cache read checks: zlib-ng's, which must be zlib's bit for bit (a store
written with one is read with the other: the formats record no implementation)."""

from __future__ import annotations

import zlib

import numpy as np

from layerwise.store._checksum import IMPLEMENTATION, crc32


def test_the_fast_crc32_is_zlibs_on_every_size_and_start():
    rng = np.random.default_rng(0)
    for size in (0, 1, 7, 64, 1000, 4096 + 3, 1 << 20):
        data = rng.integers(0, 256, size, dtype=np.uint8)
        for start in (0, 1, 0xFFFFFFFF, int(rng.integers(0, 2**32))):
            assert crc32(data, start) == zlib.crc32(data, start)
    rows = rng.standard_normal((37, 13, 8)).astype(np.float16)  # a text's rows, as the store checks them
    assert crc32(rows) == zlib.crc32(rows.tobytes())
    assert crc32(rows[20:], crc32(rows[:20])) == crc32(rows)  # continued across pieces, as bulk reads do


def test_the_test_install_has_the_vectorised_crc32():
    assert IMPLEMENTATION == "zlib-ng"  # the store and cache extras install it; zlib is the fallback
