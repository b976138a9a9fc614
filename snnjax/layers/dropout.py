"""Dropout over time-major tensors."""
from __future__ import annotations

from flax import nnx


def dropout(rate: float, *, share_over_time: bool = False, rngs: nnx.Rngs | None = None) -> nnx.Dropout:
    """Dropout on ``[T, N, ...]``.

    ``share_over_time`` reuses one mask for all T steps (SpikingJelly's ``layer.Dropout``).
    """
    return nnx.Dropout(rate, broadcast_dims=(0,) if share_over_time else (), rngs=rngs)
