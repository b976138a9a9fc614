"""Shared test helpers (a plain module on the tests' sys.path; test modules import it, never each other)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flax import nnx

from snnjax.models import Sequential


def gesture_sequential(in_shape: Sequence[int], channels: int, num_classes: int, *, blocks: int, hidden: int,
                       pool: str, rngs: nnx.Rngs, **dtypes: Any) -> Sequential:
    """A small DVSGestureNet-like ``Sequential`` (the form streaming, export and NIR take): ``blocks`` x
    [Conv3x3 (no bias) -> BatchNorm -> LIF -> ``pool`` 2], flatten, Linear(hidden) -> LIF, Linear(num_classes);
    LIF tau 2, hard reset to 0, ``detach_reset``; ``pool`` ``"max"`` or ``"avg"``."""
    cell = {"kind": "neuron", "type": "LIF", "tau": 2.0, "detach_reset": True}
    specs: list[dict[str, Any]] = []
    for _ in range(blocks):
        specs += [{"kind": "conv", "features": channels, "kernel": 3, "padding": 1, "bias": False},
                  {"kind": "batchnorm"}, dict(cell), {"kind": f"{pool}pool", "size": 2}]
    specs += [{"kind": "flatten"}, {"kind": "dropout"}, {"kind": "linear", "features": hidden}, dict(cell),
              {"kind": "dropout"}, {"kind": "linear", "features": num_classes}]
    return Sequential.from_specs(in_shape, specs, rngs=rngs, **dtypes)
