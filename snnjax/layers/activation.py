"""``ReLU`` as a layer, for the ANNs that ``snnjax.ann2snn`` converts (each ReLU becomes an IF neuron there)."""
from __future__ import annotations

import jax
from flax import nnx


class ReLU(nnx.Module):
    """``max(x, 0)`` elementwise on any shape (torch's ``nn.ReLU``)."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.relu(x)
