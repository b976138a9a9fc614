"""2-D pooling over channels-last ``[..., H, W, C]`` tensors (any leading dims, e.g. ``[T, N]``).

Padding follows torch: max pooling pads with -inf, average pooling here is
unpadded (``count_include_pad`` is irrelevant without padding).

Max pooling's gradient goes to the first maximum of each window (row-major), as
XLA's ``select_and_scatter`` and torch do. It is written with strided slices and
pads and keeps only the winning cell of each window (int8): XLA:CPU's
``select_and_scatter`` takes about 9x the activation in temporaries, and XLA's SPMD
partitioner gathers its operand whole (the batch, or the channels under tensor
parallelism) onto every device.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def _window(x, k, s):
    lead = x.ndim - 3
    return (1,) * lead + (k, k, 1), (1,) * lead + (s, s, 1)


def avg_pool2d(x: jax.Array, kernel_size: int, stride: int | None = None) -> jax.Array:
    """Mean over ``kernel_size x kernel_size`` windows; ``[..., H, W, C] -> [..., H', W', C]``."""
    dims, strides = _window(x, kernel_size, stride or kernel_size)
    total = jax.lax.reduce_window(x, 0.0, jax.lax.add, dims, strides, "VALID")
    return total / (kernel_size * kernel_size)


def adaptive_avg_pool2d(x: jax.Array, output_size: int | tuple[int, int]) -> jax.Array:
    """torch's ``AdaptiveAvgPool2d``: ``[..., H, W, C] -> [..., oh, ow, C]``.

    Output row ``i`` is the mean of input rows ``floor(i * H / oh)`` to ``ceil((i + 1) * H / oh) - 1`` (columns
    likewise): windows of unequal sizes that may overlap; ``H < oh`` repeats rows (a 1 x 1 map fills every cell).
    """
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    h, w = x.shape[-3], x.shape[-2]
    if (h, w) == (oh, ow):
        return x
    return jnp.einsum("...hwc,ih,jw->...ijc", x, _bin_means(h, oh, x.dtype), _bin_means(w, ow, x.dtype))


def _bin_means(size: int, out: int, dtype) -> jax.Array:
    """``[out, size]``: row ``i`` averages adaptive window ``i`` of an axis of ``size`` cells."""
    m = np.zeros((out, size))
    for i in range(out):
        lo, hi = (i * size) // out, -((-(i + 1) * size) // out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return jnp.asarray(m, dtype)


def max_pool2d(x: jax.Array, kernel_size: int, stride: int | None = None, padding: int = 0) -> jax.Array:
    """Max over windows with symmetric ``padding`` (padded cells never win); the gradient goes to the first
    maximum of each window in row-major order, as torch's does."""
    return _max_pool_taps(x, kernel_size, stride or kernel_size, padding, x.shape)


def _max_pool(x, k, s, p):
    """The reference: XLA's ``reduce_window`` (its gradient is a ``select_and_scatter``)."""
    dims, strides = _window(x, k, s)
    pads = [(0, 0)] * (x.ndim - 3) + [(p, p), (p, p), (0, 0)]
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, dims, strides, pads)


def _pad_hw(x, value, hw_pads):
    """``x [..., H, W, C]`` padded (or cropped, for negative widths) by ``hw_pads = ((lo, hi), (lo, hi))``."""
    config = [(0, 0, 0)] * (x.ndim - 3) + [(lo, hi, 0) for lo, hi in hw_pads] + [(0, 0, 0)]
    return jax.lax.pad(x, jnp.array(value, x.dtype), config)


# XLA:CPU expands reduce_window's select_and_scatter gradient into a scatter with int32 index tensors: about
# 9x the activation in temporaries and 2-4x slower (Spikformer's 224x224 stem, VGG). Here the forward keeps the
# winning cell of each window as int8, and the backward builds the input gradient phase by phase (the input
# cells with the same position modulo the stride), each phase a sum of shifted output-sized tensors, so no
# input-sized temporary beyond the result is needed; the same ops partition under SPMD, where a
# select_and_scatter's operand would be gathered whole.
@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _max_pool_taps(x, k, s, p, shape):
    return _max_pool_taps_fwd(x, k, s, p, shape)[0]


def _max_pool_taps_fwd(x, k, s, p, shape):
    xp = _pad_hw(x, -jnp.inf, ((p, p), (p, p)))
    ho, wo = (xp.shape[-3] - k) // s + 1, (xp.shape[-2] - k) // s + 1
    y, tap = None, None
    # The maximum is selected from the window cells themselves, so its cell is exact even where XLA fuses the
    # producer into each slice (comparing with a separately computed maximum can miss by an ulp).
    for t in range(k * k):
        i, j = divmod(t, k)
        view = xp[..., i:i + s * (ho - 1) + 1:s, j:j + s * (wo - 1) + 1:s, :]
        if y is None:
            y, tap = view, jnp.zeros(view.shape, jnp.int8)
            continue
        wins = (view > y) | (jnp.isnan(view) & ~jnp.isnan(y))  # strictly greater: the first maximum stays
        y, tap = jnp.where(wins, view, y), jnp.where(wins, jnp.int8(t), tap)
    return y, _pack_taps(tap, k)


# Two taps per byte (k*k <= 16) halve the residual; packing is a reduction, which also keeps XLA from fusing the
# tap computation into the backward (elementwise int8 taps were recomputed there, so the float padded input
# stayed alive from the forward to the backward instead).
def _pack_taps(tap, k):
    if k * k > 16:
        return tap
    c = tap.shape[-1]
    t = _pad_c(tap.astype(jnp.uint8), c % 2).reshape(*tap.shape[:-1], -1, 2)
    return jnp.sum(t << jnp.array([0, 4], jnp.uint8), axis=-1, dtype=jnp.uint8)


def _unpack_taps(packed, k, c):
    if k * k > 16:
        return packed
    t = (packed[..., None] >> jnp.array([0, 4], jnp.uint8)) & 15
    return t.reshape(*packed.shape[:-1], -1)[..., :c]


def _pad_c(x, extra):
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)]) if extra else x


def _max_pool_taps_bwd(k, s, p, shape, packed, g):
    (ho, wo), (h, w) = g.shape[-3:-1], shape[-3:-1]
    tap = _unpack_taps(packed, k, g.shape[-1])
    qh, qw = -(-h // s), -(-w // s)  # rows / columns of each phase of x
    zero = jnp.zeros((), g.dtype)
    dx = None
    for ri in range(s):
        for rj in range(s):
            # x cell (s*a + ri, s*b + rj) is padded cell (s*a + ri + p, ...): cell (i, j) of window
            # (a + (ri + p - i) / s, b + (rj + p - j) / s) for the taps i, j congruent to ri + p, rj + p modulo s
            phase = jnp.zeros(g.shape[:-3] + (qh, qw, g.shape[-1]), g.dtype)
            for i in range((ri + p) % s, k, s):
                for j in range((rj + p) % s, k, s):
                    di, dj = (ri + p - i) // s, (rj + p - j) // s
                    part = jnp.where(tap == i * k + j, g, zero)
                    phase = phase + _pad_hw(part, 0, ((-di, qh - ho + di), (-dj, qw - wo + dj)))
            # the phase's cells interleaved into x's grid: rows ri, ri + s, ... and columns rj, rj + s, ...
            config = [(0, 0, 0)] * (g.ndim - 3) + [(ri, s - 1 - ri, s - 1), (rj, s - 1 - rj, s - 1), (0, 0, 0)]
            spread = jax.lax.pad(phase, zero, config)
            dx = spread if dx is None else dx + spread
    return (dx if (qh * s, qw * s) == (h, w) else dx[..., :h, :w, :],)  # x's own cells: no crop of the padding


_max_pool_taps.defvjp(_max_pool_taps_fwd, _max_pool_taps_bwd)


class AvgPool2d(nnx.Module):
    """Module form of ``avg_pool2d``."""

    def __init__(self, kernel_size: int, stride: int | None = None):
        self.kernel_size, self.stride = kernel_size, stride

    def __call__(self, x):
        return avg_pool2d(x, self.kernel_size, self.stride)


class AdaptiveAvgPool2d(nnx.Module):
    """Module form of ``adaptive_avg_pool2d`` (torch's ``AdaptiveAvgPool2d``)."""

    def __init__(self, output_size: int | tuple[int, int]):
        self.output_size = output_size

    def __call__(self, x):
        return adaptive_avg_pool2d(x, self.output_size)


class MaxPool2d(nnx.Module):
    """Module form of ``max_pool2d``."""

    def __init__(self, kernel_size: int, stride: int | None = None, padding: int = 0):
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def __call__(self, x):
        return max_pool2d(x, self.kernel_size, self.stride, self.padding)
