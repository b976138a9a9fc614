"""Convolution and linear layers over time-major, channels-last tensors.

Flax's ``Conv`` and ``Linear`` already treat every leading axis as batch, so
``[T, N, H, W, C]`` runs as one merged ``[T*N]`` batch (SpikingJelly's
``SeqToANNContainer``) without an explicit reshape.
"""
from __future__ import annotations

import jax
from flax import nnx


def conv2d(in_channels: int, out_channels: int, kernel_size: int, *, stride: int = 1, padding: int = 0,
           use_bias: bool = True, kernel_init=None, rngs: nnx.Rngs, dtype=None, param_dtype=None) -> nnx.Conv:
    """A torch-style ``Conv2d`` (integer symmetric padding) on ``[..., H, W, C]``; kernel ``[kh, kw, I, O]``."""
    kwargs = {}
    if kernel_init is not None:
        kwargs["kernel_init"] = kernel_init
    if param_dtype is not None:
        kwargs["param_dtype"] = param_dtype
    return nnx.Conv(in_channels, out_channels, (kernel_size, kernel_size), strides=stride,
                    padding=((padding, padding), (padding, padding)), use_bias=use_bias,
                    dtype=dtype, rngs=rngs, **kwargs)


def linear(in_features: int, out_features: int, *, use_bias: bool = True, kernel_init=None,
           rngs: nnx.Rngs, dtype=None, param_dtype=None) -> nnx.Linear:
    """``[..., in] -> [..., out]``; kernel ``[in, out]`` (a torch ``Conv1d(k=1)`` on tokens is this too)."""
    kwargs = {}
    if kernel_init is not None:
        kwargs["kernel_init"] = kernel_init
    if param_dtype is not None:
        kwargs["param_dtype"] = param_dtype
    return nnx.Linear(in_features, out_features, use_bias=use_bias, dtype=dtype, rngs=rngs, **kwargs)


def flatten_features(x: jax.Array, lead: int = 2) -> jax.Array:
    """Flatten everything after the first ``lead`` axes: ``[T, N, H, W, C] -> [T, N, H*W*C]`` (HWC order)."""
    return x.reshape(x.shape[:lead] + (-1,))
