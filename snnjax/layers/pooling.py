"""2-D pooling over channels-last ``[..., H, W, C]`` tensors (any leading dims, e.g. ``[T, N]``).

Padding follows torch: max pooling pads with -inf, average pooling here is
unpadded (``count_include_pad`` is irrelevant without padding).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def _window(x, k, s):
    lead = x.ndim - 3
    return (1,) * lead + (k, k, 1), (1,) * lead + (s, s, 1)


def avg_pool2d(x: jax.Array, kernel_size: int, stride: int | None = None) -> jax.Array:
    """Mean over ``kernel_size x kernel_size`` windows; ``[..., H, W, C] -> [..., H', W', C]``."""
    dims, strides = _window(x, kernel_size, stride or kernel_size)
    total = jax.lax.reduce_window(x, 0.0, jax.lax.add, dims, strides, "VALID")
    return total / (kernel_size * kernel_size)


def max_pool2d(x: jax.Array, kernel_size: int, stride: int | None = None, padding: int = 0) -> jax.Array:
    """Max over windows with symmetric ``padding`` (padded cells never win)."""
    dims, strides = _window(x, kernel_size, stride or kernel_size)
    pads = [(0, 0)] * (x.ndim - 3) + [(padding, padding), (padding, padding), (0, 0)]
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, dims, strides, pads)


class AvgPool2d(nnx.Module):
    """Module form of ``avg_pool2d``."""

    def __init__(self, kernel_size: int, stride: int | None = None):
        self.kernel_size, self.stride = kernel_size, stride

    def __call__(self, x):
        return avg_pool2d(x, self.kernel_size, self.stride)


class MaxPool2d(nnx.Module):
    """Module form of ``max_pool2d``."""

    def __init__(self, kernel_size: int, stride: int | None = None, padding: int = 0):
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def __call__(self, x):
        return max_pool2d(x, self.kernel_size, self.stride, self.padding)
