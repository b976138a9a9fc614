"""BatchNorm over channels-last tensors with PyTorch's exact semantics.

Statistics reduce over every axis but the last, so ``[T, N, H, W, C]`` behaves
like SpikingJelly's ``SeqToANNContainer(BatchNorm2d)`` on the merged ``[T*N]``
batch, and ``[T, N, L, C]`` like ``BatchNorm1d`` on ``[T*N, C, L]``. ``num_features`` may be a
tuple: the channels are then the trailing dims (e.g. ``(3, heads, head_dim)`` of a fused
q/k/v projection), each normalised on its own exactly as the flattened channels would be.
Train mode normalises with the biased batch variance and updates
``running = (1 - momentum) * running + momentum * batch`` with the *unbiased*
batch variance, as torch does.
"""
from __future__ import annotations

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
        if self.use_running_average:
            mean, var = self.mean[...].astype(stat_dtype), self.var[...].astype(stat_dtype)
        else:
            axes = tuple(range(x.ndim - k))
            n = x.size // math.prod(self.feature_shape)
            mean = jnp.mean(xs, axes)
            var = jnp.mean(jnp.square(xs - mean), axes)
            m = self.momentum
            unbiased = var * (n / max(n - 1, 1))
            rdt = self.mean[...].dtype
            self.mean[...] = ((1 - m) * self.mean[...] + m * jax.lax.stop_gradient(mean)).astype(rdt)
            self.var[...] = ((1 - m) * self.var[...] + m * jax.lax.stop_gradient(unbiased)).astype(rdt)
        y = (xs - mean) * jax.lax.rsqrt(var + self.eps)
        y = y * self.scale[...].astype(stat_dtype) + self.bias[...].astype(stat_dtype)
        return y.astype(dtype)
