"""Shared test helpers (a plain module on the tests' sys.path; test modules import it, never each other).

Importable with numpy alone: the fixture generators run in SpikingJelly's environment, without jax, and take
``seeded_uniform`` from here (``tests/fixtures/spikingjelly/make_reference_calls.py``); helpers that need flax
import it when called.
"""
from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from flax import nnx

    from snnjax.models import Sequential


def gesture_sequential(in_shape: Sequence[int], channels: int, num_classes: int, *, blocks: int, hidden: int,
                       pool: str, rngs: nnx.Rngs, **dtypes: Any) -> Sequential:
    """A small DVSGestureNet-like ``Sequential`` (the form streaming, export and NIR take): ``blocks`` x
    [Conv3x3 (no bias) -> BatchNorm -> LIF -> ``pool`` 2], flatten, Linear(hidden) -> LIF, Linear(num_classes);
    LIF tau 2, hard reset to 0, ``detach_reset``; ``pool`` ``"max"`` or ``"avg"``."""
    from snnjax.models import Sequential  # noqa: PLC0415 (this module imports without jax: docstring)

    cell = {"kind": "neuron", "type": "LIF", "tau": 2.0, "detach_reset": True}
    specs: list[dict[str, Any]] = []
    for _ in range(blocks):
        specs += [{"kind": "conv", "features": channels, "kernel": 3, "padding": 1, "bias": False},
                  {"kind": "batchnorm"}, dict(cell), {"kind": f"{pool}pool", "size": 2}]
    specs += [{"kind": "flatten"}, {"kind": "dropout"}, {"kind": "linear", "features": hidden}, dict(cell),
              {"kind": "dropout"}, {"kind": "linear", "features": num_classes}]
    return Sequential.from_specs(in_shape, specs, rngs=rngs, **dtypes)


def seeded_uniform(seed: int, name: str, shape: Sequence[int]) -> np.ndarray:
    """float64 uniform on ``[-1, 1)`` of ``shape``, a function of ``(seed, name)`` only: full-size weights of the
    golden data are regenerated, not stored (``tests/test_zoo_calls.py``).

    Built from PCG64's raw 64-bit stream (NEP 19 keeps bit generators' streams fixed across numpy versions;
    the ``Generator`` distributions may change): the top 53 bits of each word, scaled exactly.
    """
    n = int(np.prod(shape, dtype=np.int64))
    words = np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(name.encode())])).random_raw(n)
    return ((words >> np.uint64(11)).astype(np.float64) * 2.0**-52 - 1.0).reshape(tuple(shape))
