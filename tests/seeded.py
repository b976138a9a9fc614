"""Seeded weights for full-size golden data: numpy only, so the fixture generators (run where SpikingJelly and torch
are installed, without jax) import it as the tests do (``tests/fixtures/spikingjelly/make_reference_calls.py``,
``tests/test_zoo_calls.py``)."""
from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np


def seeded_uniform(seed: int, name: str, shape: Sequence[int]) -> np.ndarray:
    """float64 uniform on ``[-1, 1)`` of ``shape``, a function of ``(seed, name)`` only: full-size weights of the
    golden data are regenerated, not stored.

    Built from PCG64's raw 64-bit stream (NEP 19 keeps bit generators' streams fixed across numpy versions;
    the ``Generator`` distributions may change): the top 53 bits of each word, scaled exactly.
    """
    n = int(np.prod(shape, dtype=np.int64))
    words = np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(name.encode())])).random_raw(n)
    words >>= np.uint64(11)
    out = words.view(np.int64).astype(np.float64)  # < 2**53: exact, and signed converts several times faster
    out *= 2.0**-52  # in place: a full-size layer's ~100M draws make each temporary ~1 GB
    out -= 1.0
    return out.reshape(tuple(shape))
