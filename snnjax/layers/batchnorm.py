"""BatchNorm over channels-last tensors with PyTorch's exact semantics.

Statistics reduce over every axis but the last, so ``[T, N, H, W, C]`` behaves
like SpikingJelly's ``SeqToANNContainer(BatchNorm2d)`` on the merged ``[T*N]``
batch, and ``[T, N, L, C]`` like ``BatchNorm1d`` on ``[T*N, C, L]``. ``num_features`` may be a
tuple: the channels are then the trailing dims (e.g. ``(3, heads, head_dim)`` of a fused
q/k/v projection), each normalised on its own exactly as the flattened channels would be.
Train mode normalises with the biased batch variance and updates
``running = (1 - momentum) * running + momentum * batch`` with the *unbiased*
batch variance, as torch does. Training mode differentiates through
``batch_normalize``, whose backward is the closed form (two reductions and one
elementwise pass; autodiff's chain through the statistics takes several more).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax.parallel.logical import annotate


class BatchNorm(nnx.Module):
    """Per-channel batch normalisation; ``use_running_average`` is toggled by ``model.eval()`` / ``model.train()``."""

    def __init__(self, num_features: int | tuple[int, ...], *, momentum: float = 0.1, eps: float = 1e-5,
                 use_running_average: bool = False, param_dtype=None, dtype=None, axes=None):
        """``axes``: logical names of the channel dims (parameters and statistics follow their channels)."""
        param_dtype = param_dtype or jnp.float32
        num_features = (num_features,) if isinstance(num_features, int) else tuple(num_features)
        self.num_features = num_features if len(num_features) > 1 else num_features[0]
        self.feature_shape = num_features
        self.momentum = momentum
        self.eps = eps
        self.use_running_average = use_running_average
        self.dtype = dtype
        self.scale = nnx.Param(jnp.ones(num_features, param_dtype))
        self.bias = nnx.Param(jnp.zeros(num_features, param_dtype))
        self.mean = nnx.BatchStat(jnp.zeros(num_features, param_dtype))
        self.var = nnx.BatchStat(jnp.ones(num_features, param_dtype))
        if axes is not None:
            for var in (self.scale, self.bias, self.mean, self.var):
                annotate(var, *axes)

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [..., *C]`` -> normalised ``[..., *C]`` in the compute dtype."""
        k = len(self.feature_shape)
        if tuple(x.shape[x.ndim - k:]) != self.feature_shape:
            where = "the last axis" if k == 1 else f"the last {k} axes"
            raise ValueError(f"BatchNorm expects {self.num_features} channels in {where}, got shape {x.shape}")
        dtype = self.dtype or jnp.promote_types(x.dtype, self.scale[...].dtype)
        # Statistics in at least float32, even for bfloat16 compute.
        stat_dtype = jnp.promote_types(dtype, jnp.float32)
        xs = x.astype(stat_dtype)
        scale, bias = self.scale[...].astype(stat_dtype), self.bias[...].astype(stat_dtype)
        if self.use_running_average:
            mean, var = self.mean[...].astype(stat_dtype), self.var[...].astype(stat_dtype)
            y = (xs - mean) * jax.lax.rsqrt(var + self.eps) * scale + bias
            return y.astype(dtype)
        y, mean, var = batch_normalize(xs, scale, bias, self.eps)
        n = x.size // math.prod(self.feature_shape)
        m = self.momentum
        unbiased = var * (n / max(n - 1, 1))
        rdt = self.mean[...].dtype
        self.mean[...] = ((1 - m) * self.mean[...] + m * jax.lax.stop_gradient(mean)).astype(rdt)
        self.var[...] = ((1 - m) * self.var[...] + m * jax.lax.stop_gradient(unbiased)).astype(rdt)
        return y.astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def batch_normalize(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(y, mean, var)``: ``x [..., *C]`` normalised with its batch statistics over every leading axis.

    ``y = (x - mean) / sqrt(var + eps) * scale + bias``, ``var`` biased. Its backward is the closed form
    (two reductions, one elementwise pass) rather than autodiff's chain through ``mean`` and ``var``.
    """
    return _batch_normalize(x, scale, bias, eps)[0]


def _batch_normalize(x, scale, bias, eps):
    axes = tuple(range(x.ndim - scale.ndim))
    mean = jnp.mean(x, axes)
    # ``mean - x``, not ``x - mean``: XLA would merge the latter (materialised for this reduction) with the
    # backward's ``x - mean`` and keep it from the forward to the backward beside ``x``.
    var = jnp.mean(jnp.square(mean - x), axes)
    rstd = jax.lax.rsqrt(var + eps)
    y = (x - mean) * (rstd * scale) + bias
    return (y, mean, var), (x, mean, rstd, scale)


def _batch_normalize_bwd(eps, res, cts):
    x, mean, rstd, scale = res
    dy, dmean, dvar = cts
    axes = tuple(range(x.ndim - scale.ndim))
    n = x.size // scale.size
    # No tensor here is a function of the residuals alone, which XLA:CPU computes during the forward and keeps to
    # the backward (a separate ``xhat`` did that; so did ``x`` itself where it is a convolution's output plus a
    # bias, held beside the convolution's output): ``dscale`` reduces ``dy * x`` with ``x`` selected where ``dy``
    # is nonzero (the same products), and ``x - mean`` appears only inside the elementwise ``dx``.
    dbias = jnp.sum(dy, axes)
    dscale = (jnp.sum(dy * jnp.where(dy != 0, x, 0), axes) - mean * dbias) * rstd
    # d/dx of y through x, mean and var; then the statistics' own cotangents (zero in training).
    dx = (rstd * scale) * (dy - (dbias + (x - mean) * (rstd * dscale)) / n) + (dmean + 2 * dvar * (x - mean)) / n
    return dx, dscale, dbias


batch_normalize.defvjp(_batch_normalize, _batch_normalize_bwd)
