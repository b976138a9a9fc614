"""2-D pooling over channels-last ``[..., H, W, C]`` tensors (any leading dims, e.g. ``[T, N]``).

Padding follows torch: max pooling pads with -inf, average pooling here is
unpadded (``count_include_pad`` is irrelevant without padding).

Max pooling's gradient goes to the first maximum of each window (row-major), as
XLA's ``select_and_scatter`` does. Under a parallel plan the backward is written
with strided slices and pads instead (``_max_pool_split``), because XLA's SPMD
partitioner gathers a ``select_and_scatter``'s operand whole (the batch, or the
channels under tensor parallelism) onto every device; the result is the same.
Whether a plan is active is the layout context's ``is_partitioned()`` (``snnjax.parallel.logical``).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax.parallel.logical import is_partitioned


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
    stride = stride or kernel_size
    if is_partitioned():
        return _max_pool_split(x, kernel_size, stride, padding)
    return _max_pool(x, kernel_size, stride, padding)


def _max_pool(x, k, s, p):
    dims, strides = _window(x, k, s)
    pads = [(0, 0)] * (x.ndim - 3) + [(p, p), (p, p), (0, 0)]
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, dims, strides, pads)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _max_pool_split(x, k, s, p):
    return _max_pool(x, k, s, p)


def _max_pool_split_fwd(x, k, s, p):
    y = _max_pool(x, k, s, p)
    return y, (x, y)


def _max_pool_split_bwd(k, s, p, res, g):
    x, y = res
    lead = [(0, 0, 0)] * (x.ndim - 3)
    xp = jax.lax.pad(x, jnp.array(-jnp.inf, x.dtype), lead + [(p, p, 0), (p, p, 0), (0, 0, 0)])
    hp, wp = xp.shape[-3:-1]
    ho, wo = y.shape[-3:-1]
    taken = jnp.zeros(y.shape, bool)
    dxp = jnp.zeros(xp.shape, g.dtype)
    zero = jnp.array(0, g.dtype)
    for i in range(k):
        for j in range(k):
            window = xp[..., i:i + s * (ho - 1) + 1:s, j:j + s * (wo - 1) + 1:s, :]
            hit = (window == y) & ~taken  # the first maximum of each window, in row-major order
            taken = taken | hit
            contrib = jnp.where(hit, g, zero)
            dxp = dxp + jax.lax.pad(contrib, zero, lead + [(i, hp - i - s * (ho - 1) - 1, s - 1),
                                                          (j, wp - j - s * (wo - 1) - 1, s - 1), (0, 0, 0)])
    h, w = x.shape[-3:-1]
    return (dxp[..., p:p + h, p:p + w, :],)


_max_pool_split.defvjp(_max_pool_split_fwd, _max_pool_split_bwd)


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
